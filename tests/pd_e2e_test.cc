// Prefill-decode disaggregation end to end (label pd): a frontend (connex-stage --pd-role
// frontend, serving the OpenAI API), two prefill and two decode instances, real processes on
// loopback started with connex-chaos's Cluster; greedy and sampled streamed completions checked
// with chaos::Check against connex-generate. A prefill instance killed mid-prefill, both killed
// after their handoffs, a decode instance killed mid-generation (with a decode KV standby, and
// without: from the prefill instance's retained copy), and a decode instance that joins mid-run.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "connex/base/subprocess.h"
#include "connex/base/wait.h"
#include "connex/chaos/cluster.h"
#include "connex/chaos/load.h"
#include "connex/chaos/reference.h"
#include "gtest/gtest.h"

namespace connex::testing {
namespace {

constexpr char kModel[] = "tiny";
constexpr uint32_t kPrefill = 1;
constexpr uint32_t kDecode = 2;

class PdE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/pd-e2e-" + std::to_string(getpid()));
    std::filesystem::create_directories(*dir_ + "/" + kModel);
    absl::Status made = chaos::MakeModel(BinDir(), ModelPath(),
                                         {"--layers", "3", "--dim", "64", "--heads", "4",
                                          "--kv-heads", "2", "--ffn", "128", "--seed", "11"});
    ASSERT_TRUE(made.ok()) << made;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string ModelPath() { return *dir_ + "/" + kModel + "/model.safetensors"; }

  void Start(bool kv_standby) {
    work_dir_ = *dir_ + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(work_dir_);
    chaos::ClusterOptions o;
    o.bin_dir = BinDir();
    o.work_dir = work_dir_;
    o.model_path = ModelPath();
    o.model_name = kModel;
    o.replicas = 1;
    o.stages = 2;
    o.pd_prefill = 2;
    o.pd_decode = 2;
    o.proxy = false;
    o.kv_standby = kv_standby;
    o.start_timeout_ms = 20'000;
    absl::StatusOr<std::unique_ptr<chaos::Cluster>> c = chaos::Cluster::Start(std::move(o));
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
  }
  void TearDown() override {
    if (HasFailure() && cluster_) {
      // The end of every log of the deployment (its processes' stderr goes to files).
      for (const auto& entry : std::filesystem::directory_iterator(work_dir_)) {
        if (entry.path().extension() != ".log") continue;
        std::ifstream in(entry.path());
        std::vector<std::string> lines;
        for (std::string line; std::getline(in, line);) lines.push_back(line);
        std::printf("--- %s\n", entry.path().c_str());
        for (size_t i = lines.size() > 20 ? lines.size() - 20 : 0; i < lines.size(); ++i)
          std::printf("  %s\n", lines[i].c_str());
      }
    }
    cluster_.reset();
  }

  // Requests i = first .. first + n - 1 (odd ones sampled), streamed to the frontend.
  void Issue(uint64_t first, int n, int max_tokens, size_t prompt_repeat = 1) {
    load_.set_model(kModel);
    for (uint64_t i = first; i < first + static_cast<uint64_t>(n); ++i) {
      chaos::RequestSpec spec = chaos::SpecFor(i, max_tokens);
      std::string prompt;
      for (size_t k = 0; k < prompt_repeat; ++k) prompt += spec.prompt + " ";
      spec.prompt = prompt;
      spec.ignore_eos = true;  // every stream runs its whole length: the faults land mid-stream
      load_.Issue(i, spec, cluster_->api(0), "frontend", -1, 120'000);
    }
  }
  bool AllHaveTokens(int n) {
    return WaitUntil([&] { return load_.AllHaveTokens(n); }, 60'000);
  }
  // Every stream completed exactly as connex-generate's.
  void ExpectCorrect() {
    std::vector<std::shared_ptr<chaos::Outcome>> outcomes = load_.Wait();
    chaos::CommonOptions o;
    o.bin_dir = BinDir();
    o.work_dir = work_dir_;
    o.stages = 2;
    o.progress = false;
    ASSERT_TRUE(chaos::Check(o, ModelPath(), outcomes).ok());
    for (const auto& out : outcomes) {
      EXPECT_TRUE(out->correct) << "request " << out->index << ": " << out->result.error << " "
                                << chaos::Differences(*out);
    }
  }
  double Frontend(const std::string& name) {
    absl::StatusOr<std::map<std::string, double>> m = cluster_->Metrics(0, 0);
    if (!m.ok()) return -1;
    auto it = m->find(name);
    return it == m->end() ? 0 : it->second;
  }
  double Metric(uint32_t group, uint32_t replica, const std::string& name) {
    absl::StatusOr<std::map<std::string, double>> m = cluster_->Metrics(group, replica);
    if (!m.ok()) return -1;
    auto it = m->find(name);
    return it == m->end() ? 0 : it->second;
  }

  static std::string* dir_;
  std::string work_dir_;
  std::unique_ptr<chaos::Cluster> cluster_;
  chaos::Load load_;
};

std::string* PdE2eTest::dir_ = nullptr;

TEST_F(PdE2eTest, APrefillInstanceKilledMidPrefillIsPrefilledAgainElsewhere) {
  ASSERT_NO_FATAL_FAILURE(Start(/*kv_standby=*/true));
  // Frozen first, so that the prefills sent to it are under way there when it dies.
  ASSERT_TRUE(cluster_->Stop(kPrefill, 0).ok());
  Issue(0, 6, 40);
  ASSERT_TRUE(WaitUntil([&] { return Frontend("connex_stage_pd_prefilling") >= 1; }, 10'000));
  ASSERT_TRUE(cluster_->Kill(kPrefill, 0).ok());
  ExpectCorrect();
  EXPECT_GT(Frontend("connex_stage_failovers_total"), 0);
  EXPECT_EQ(Frontend("connex_stage_pd_handoffs_total"), 6);
}

TEST_F(PdE2eTest, PrefillInstancesKilledAfterTheirHandoffsLoseNothing) {
  ASSERT_NO_FATAL_FAILURE(Start(/*kv_standby=*/true));
  Issue(0, 6, 300);
  ASSERT_TRUE(AllHaveTokens(10));
  ASSERT_TRUE(cluster_->Kill(kPrefill, 0).ok());
  ASSERT_TRUE(cluster_->Kill(kPrefill, 1).ok());
  ExpectCorrect();
  EXPECT_EQ(Frontend("connex_stage_failovers_total"), 0);
  EXPECT_EQ(Frontend("connex_stage_reprefills_total"), 0);
}

TEST_F(PdE2eTest, ADecodeInstanceKilledMidGenerationContinuesFromItsStandby) {
  ASSERT_NO_FATAL_FAILURE(Start(/*kv_standby=*/true));
  Issue(0, 6, 300);
  ASSERT_TRUE(AllHaveTokens(20));
  ASSERT_TRUE(cluster_->Kill(kDecode, 0).ok());
  ExpectCorrect();
  EXPECT_GT(Frontend("connex_stage_failovers_total"), 0);
  EXPECT_EQ(Frontend("connex_stage_reprefills_total"), 0);
  EXPECT_GT(Metric(kDecode, 1, "connex_stage_kv_takeovers_total") +
                Metric(kDecode, 1, "connex_stage_kv_takeovers_lagged_total"),
            0);
}

TEST_F(PdE2eTest, ADecodeInstanceKilledWithoutAStandbyResumesFromTheRetainedCopy) {
  ASSERT_NO_FATAL_FAILURE(Start(/*kv_standby=*/false));
  Issue(0, 6, 300);
  ASSERT_TRUE(AllHaveTokens(20));
  ASSERT_TRUE(cluster_->Kill(kDecode, 0).ok());
  ExpectCorrect();
  EXPECT_GT(Frontend("connex_stage_pd_retained_resumes_total"), 0);
  EXPECT_EQ(Frontend("connex_stage_reprefills_total"), 0);
}

TEST_F(PdE2eTest, ADecodeInstanceThatJoinsMidRunTakesTraffic) {
  ASSERT_NO_FATAL_FAILURE(Start(/*kv_standby=*/true));
  ASSERT_TRUE(cluster_->Leave(kDecode, 1).ok());  // one decode instance to begin with
  Issue(0, 4, 200);
  ASSERT_TRUE(AllHaveTokens(10));
  ASSERT_TRUE(cluster_->Restart(kDecode, 1).ok());
  ASSERT_TRUE(WaitUntil([&] { return cluster_->DirectoryEpoch(kDecode, 1) > 0; }, 10'000));
  Issue(4, 4, 60);  // the least loaded instance is the new one
  ExpectCorrect();
  EXPECT_GT(Metric(kDecode, 1, "connex_stage_steps_executed_total"), 0);
}

}  // namespace
}  // namespace connex::testing
