// The step protocol on the etcd directory (issue 13): a real 3-member etcd cluster, two replica
// chains of pp_test_node processes registered with `--directory etcd://...`, a stage SIGKILLed
// mid-generation, and every request finishing with exactly the tokens of an undisturbed run.
// Label etcd: skipped, saying why, where etcd is not installed.
#include <signal.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "connex/base/subprocess.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#include "connex/pp/testing/test_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/pp_owner_output.h"
#include "tests/pp_prompts.h"

namespace connex::testing {
namespace {

using directory::etcd::testing::EtcdCluster;
using directory::etcd::testing::EtcdClusterOptions;
using ::testing::HasSubstr;

constexpr int kStages = 3;

class PpEtcdProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdCluster::FindEtcd().empty()) GTEST_SKIP() << EtcdCluster::kSkipMessage;
    EtcdClusterOptions options;
    options.dir = ::testing::TempDir();
    auto cluster = EtcdCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  Subprocess Node(int stage, int replica, std::vector<std::string> extra = {},
                  std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {BinDir() + "/pp_test_node",
                                     "--directory",
                                     cluster_->address(),
                                     "--backend",
                                     "tcp",
                                     "--model",
                                     "pp",
                                     "--stage",
                                     std::to_string(stage),
                                     "--stages",
                                     std::to_string(kStages),
                                     "--replica",
                                     std::to_string(replica)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (env.empty()) env = {"CONNEX_LEASE_TTL_MS=2000"};
    env.push_back("CONNEX_LOG_LEVEL=warn");
    env.push_back("CONNEX_ENGINE_THREADS=1");
    auto p = Subprocess::Start(argv, env);
    EXPECT_TRUE(p.has_value());
    EXPECT_TRUE(p->WaitForLine("ready ", 20000).has_value()) << p->transcript();
    return std::move(*p);
  }

  std::unique_ptr<EtcdCluster> cluster_;
  std::map<std::pair<int, int>, Subprocess> stages_;
};

TEST_F(PpEtcdProcessTest, AKilledStageHandsItsStepsOverWithExactTokens) {
  for (int r = 0; r < 2; ++r) {
    for (int s = 1; s < kStages; ++s) stages_.emplace(std::make_pair(s, r), Node(s, r));
  }
  const int requests = 6, max_new = 300;
  Subprocess owner = Node(
      0, 0, {"--requests", std::to_string(requests), "--max-new-tokens", std::to_string(max_new)});
  ASSERT_TRUE(owner.WaitForLine("progress", 30000)) << owner.transcript();
  stages_.at({1, 0}).Signal(SIGKILL);
  std::string done = CheckOwnerOutput(owner, requests, 90000, [&](uint64_t id) {
    return pp::testing::ReferenceTokens(kStages, PromptOf(id), max_new);
  });
  ASSERT_FALSE(done.empty());
  // The kill was handed over, not waited out.
  EXPECT_THAT(done, ::testing::Not(HasSubstr("failovers=0 ")));
}

// Issue 23, on etcd: every member of the cluster frozen (SIGSTOP) for 3 s mid-generation, the
// holders' lease TTL 9 s (renewed every 3 s), each LID confirmed every 500 ms. The stages run
// steps on their leases meanwhile: the streams go on, nothing fails over, every token is exact.
// Before, a stage refused steps once its LID had gone unconfirmed for a heartbeat plus the
// stall bound (1.5 s) until etcd answered again.
TEST_F(PpEtcdProcessTest, StepsFlowWhileEveryEtcdMemberIsStopped) {
  const std::vector<std::string> env = {"CONNEX_LEASE_TTL_MS=9000", "CONNEX_HEARTBEAT_MS=500",
                                        "CONNEX_PP_STEP_TIMEOUT_MS=5000",
                                        "CONNEX_PP_PROBE_TIMEOUT_MS=2000"};
  for (int r = 0; r < 2; ++r) {
    for (int s = 1; s < kStages; ++s) stages_.emplace(std::make_pair(s, r), Node(s, r, {}, env));
  }
  constexpr int kRequests = 4;
  constexpr int kMaxNew = kOutageMaxNewTokens;  // they outlast the outage
  Subprocess owner = Node(0, 0,
                          {"--requests", std::to_string(kRequests), "--max-new-tokens",
                           std::to_string(kMaxNew), "--stream"},
                          env);
  StreamedOwnerOutput out(owner);
  ASSERT_TRUE(out.ReadUntil([&] { return out.tokens() >= 200; }, 60000)) << owner.transcript();
  const int64_t stopped_us = MonotonicNowUs();
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Signal(i, SIGSTOP);
  out.ReadFor(3000);  // the outage
  const int64_t resumed_us = MonotonicNowUs();
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Signal(i, SIGCONT);
  ASSERT_TRUE(out.ReadUntil([&] { return !out.done().empty(); }, 120000)) << owner.transcript();
  EXPECT_THAT(out.done(), HasSubstr("failovers=0 ")) << owner.transcript();
  ASSERT_EQ(out.finished().size(), static_cast<size_t>(kRequests)) << owner.transcript();
  for (const auto& [id, tokens] : out.finished()) {
    EXPECT_EQ(tokens, pp::testing::ReferenceTokens(kStages, PromptOf(id), kMaxNew))
        << "request " << id;
  }
  const int64_t late = out.TokensBetween(stopped_us + 2'000'000, resumed_us);
  std::printf("etcd stopped %.0f ms: %lld tokens in its last second, longest gap %.1f ms\n",
              (resumed_us - stopped_us) / 1000.0, static_cast<long long>(late),
              out.LongestGapUs() / 1000.0);
  EXPECT_GT(late, 0) << "no token in the outage's last second: the streams waited on etcd";
}

}  // namespace
}  // namespace connex::testing
