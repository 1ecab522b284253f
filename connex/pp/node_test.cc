// The step protocol over the mem transport and mem signals, with a real directory: targeted tests
// of each rule.
#include "connex/pp/node.h"

#include "connex/base/wait.h"
#include "connex/pp/testing/cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::HasSubstr;
using testing::Cluster;
using testing::ReferenceTokens;

std::unique_ptr<directory::DirectoryServer> StartDirectory() {
  directory::DirectoryServerOptions options;
  options.bind = "tcp://127.0.0.1:0";
  options.pub = "tcp://127.0.0.1:0";
  options.lease_ttl_ms = 600;
  options.heartbeat_ms = 100;
  options.tick_ms = 50;
  return *directory::DirectoryServer::Start(options);
}

StageNodeOptions FastOptions() {
  StageNodeOptions o;
  o.step_timeout_ms = 300;
  o.probe_timeout_ms = 150;
  o.ring_slots = 8;
  o.slot_bytes = 1 << 16;
  o.route_wait_ms = 10000;
  return o;
}

std::vector<int32_t> Prompt(uint64_t id) {
  std::vector<int32_t> p;
  for (uint64_t i = 0; i < 3 + id % 5; ++i) p.push_back(static_cast<int32_t>((id * 31 + i * 7) % 200));
  return p;
}

class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override { server_ = StartDirectory(); }

  std::unique_ptr<Cluster> MakeCluster(uint32_t stages, uint32_t replicas,
                                       StageNodeOptions o = FastOptions()) {
    static int counter = 0;
    auto c = std::make_unique<Cluster>(*server_, "m" + std::to_string(++counter), stages, 7, o);
    for (uint32_t r = 0; r < replicas; ++r) {
      for (uint32_t s = 0; s < stages; ++s) EXPECT_NE(c->Start(s, r), nullptr);
    }
    // Owners route only through stages they can see.
    directory::DirectoryClientOptions options;
    options.directory = server_->bind_address();
    auto watcher = directory::DirectoryClient::Connect(options);
    (*watcher)->Watch(c->model()).IgnoreError();
    EXPECT_TRUE((*watcher)->AwaitView(c->model(), [&](const auto& v) { return v.size() == stages * replicas; }, 5000));
    return c;
  }

  // Every request finished with exactly the tokens of an undisturbed run (all generated
  // `max_new` tokens, except those listed in `other_max`).
  void ExpectAllMatchReference(const Cluster& c, int max_new,
                               std::map<uint64_t, int> other_max = {}) {
    for (const auto& [id, o] : c.outcomes()) {
      ASSERT_TRUE(o.done) << "request " << id;
      ASSERT_TRUE(o.tokens.ok()) << "request " << id << ": " << o.tokens.status();
      int n = other_max.count(id) ? other_max[id] : max_new;
      EXPECT_EQ(*o.tokens, ReferenceTokens(c.stages(), Prompt(id), n)) << "request " << id;
    }
    EXPECT_THAT(c.violations(), ::testing::IsEmpty());
  }

  std::unique_ptr<directory::DirectoryServer> server_;
};

TEST_F(NodeTest, SingleChainMatchesTheReference) {
  auto c = MakeCluster(3, 1);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 12).ok());
  ASSERT_TRUE(c->AwaitAll(20000));
  ExpectAllMatchReference(*c, 12);
  EXPECT_TRUE(c->AwaitRingsEmpty(5000));
  StageNodeStats s = c->TotalStats();
  EXPECT_EQ(s.completed, 6u);
  EXPECT_EQ(s.reprefills, 0u);
  EXPECT_EQ(s.steps_replayed, 0u);
}

TEST_F(NodeTest, OneStagePipelineNeedsNoPeers) {
  auto c = MakeCluster(1, 1);
  ASSERT_TRUE(c->Submit(0, 1, Prompt(1), 5).ok());
  ASSERT_TRUE(c->AwaitAll(5000));
  ExpectAllMatchReference(*c, 5);
}

TEST_F(NodeTest, KilledStageFailsOverToAnotherReplica) {
  auto c = MakeCluster(3, 2);
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 300).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().steps_executed > 30; }, 10000));
  c->Kill(1, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 300);
  StageNodeStats s = c->TotalStats();
  EXPECT_GT(s.failovers, 0u);
  EXPECT_GT(s.reprefills, 0u);  // replica 1's stage 1 did not hold their state
  EXPECT_GT(c->engine(1, 1)->executions(), 0u);
  EXPECT_TRUE(c->AwaitRingsEmpty(5000));
}

TEST_F(NodeTest, AbortsAfterTheReprefillLimit) {
  StageNodeOptions o = FastOptions();
  o.reprefill_max = 2;
  auto c = MakeCluster(2, 1, o);
  c->engine(1, 0)->SetAmnesiac(true);  // loses every request's state after its prefill
  ASSERT_TRUE(c->Submit(0, 1, Prompt(1), 10).ok());
  ASSERT_TRUE(c->AwaitAll(10000));
  auto outcome = c->outcomes()[1];
  ASSERT_FALSE(outcome.tokens.ok());
  EXPECT_EQ(outcome.tokens.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(outcome.tokens.status().message()), HasSubstr("after 2 failovers"));
  EXPECT_EQ(c->TotalStats().reprefills, 3u);
}

TEST_F(NodeTest, DroppedDelayedAndDuplicatedSignalsChangeNothing) {
  auto c = MakeCluster(3, 1);
  c->signals().SetFaults(SignalFaults{0.05, 0.2, 0.2, 40});
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 15).ok());
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 15);
  StageNodeStats s = c->TotalStats();
  EXPECT_GT(s.duplicates_dropped + s.late_dropped + s.steps_replayed, 0u);
  c->signals().SetFaults({});
  EXPECT_TRUE(c->AwaitRingsEmpty(5000));
}

TEST_F(NodeTest, BackpressureNeverOverwritesASlot) {
  StageNodeOptions o = FastOptions();
  o.ring_slots = 1;
  o.inflight = 4;
  o.max_batch = 1;
  auto c = MakeCluster(3, 1, o);
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 8).ok());
  ASSERT_TRUE(c->AwaitAll(20000));
  ExpectAllMatchReference(*c, 8);
  EXPECT_GT(c->TotalStats().backpressured, 0u);
}

TEST_F(NodeTest, GracefulLeaveDrainsWithoutLosingSteps) {
  auto c = MakeCluster(3, 2);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 300).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().steps_executed > 20; }, 10000));
  c->Leave(2, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 300);
  EXPECT_GT(c->engine(2, 1)->executions(), 0u);
}

TEST_F(NodeTest, RejoinedStageTakesTrafficAgain) {
  auto c = MakeCluster(2, 1);
  ASSERT_TRUE(c->Submit(0, 1, Prompt(1), 5).ok());
  ASSERT_TRUE(c->AwaitAll(10000));
  c->Kill(1, 0);
  ASSERT_NE(c->Start(1, 0), nullptr);  // same LID, new process, new epoch
  ASSERT_TRUE(c->Submit(0, 2, Prompt(2), 20).ok());
  ASSERT_TRUE(c->AwaitAll(20000));
  ExpectAllMatchReference(*c, 20, {{1, 5}});
  EXPECT_GT(c->engine(1, 0)->executions(), 0u);
}

TEST_F(NodeTest, MigratedStageIsReachedWithoutRecompute) {
  auto c = MakeCluster(3, 1);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 300).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().steps_executed > 20; }, 10000));
  uint64_t before = c->node(1, 0)->epoch();
  ASSERT_TRUE(c->Migrate(1, 0).ok());
  EXPECT_GT(c->node(1, 0)->epoch(), before);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 300);
  EXPECT_GT(c->TotalStats().fenced + c->TotalStats().resends, 0u);
  EXPECT_EQ(c->TotalStats().reprefills, 0u);  // the state moved with the endpoint
}

}  // namespace
}  // namespace connex::pp
