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

  Subprocess Node(int stage, int replica, std::vector<std::string> extra = {}) {
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
    auto p = Subprocess::Start(
        argv, {"CONNEX_LOG_LEVEL=warn", "CONNEX_ENGINE_THREADS=1", "CONNEX_LEASE_TTL_MS=2000"});
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

}  // namespace
}  // namespace connex::testing
