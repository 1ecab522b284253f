// The KV standby (kv_standby.h) over the mem transport and mem signals with a real directory:
// a killed stage's requests continue on its standby without a re-prefill, a lagging standby
// recomputes only its lag, a standby over its budget falls back to re-prefill, a dead standby is
// replaced, a restarted stage is a standby again, and no mirror outlives its request.
#include "connex/pp/kv_standby.h"

#include <deque>
#include <functional>

#include "connex/base/wait.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/pp/kv_mirror_store.h"
#include "connex/pp/send_ring.h"
#include "connex/pp/testing/cluster.h"
#include "connex/pp/testing/expectations.h"
#include "connex/transport/mem/mem_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using testing::Cluster;
using testing::ReferenceTokens;

std::vector<int32_t> Prompt(uint64_t id) {
  std::vector<int32_t> p;
  for (uint64_t i = 0; i < 3 + id % 5; ++i)
    p.push_back(static_cast<int32_t>((id * 31 + i * 7) % 200));
  return p;
}

StageNodeOptions StandbyOptions() {
  StageNodeOptions o = testing::FastTestOptions();
  o.kv_standby = true;
  return o;
}

class KvStandbyTest : public ::testing::Test {
 protected:
  void SetUp() override { server_ = *directory::testing::StartTestDirectory(); }

  std::unique_ptr<Cluster> MakeCluster(uint32_t stages, uint32_t replicas,
                                       StageNodeOptions o = StandbyOptions()) {
    static int counter = 0;
    auto c = std::make_unique<Cluster>(*server_, "kv" + std::to_string(++counter), stages, 7, o);
    EXPECT_TRUE(c->StartAll(replicas).ok());
    return c;
  }

  // Every request finished with exactly the tokens of an undisturbed run.
  void ExpectAllMatchReference(const Cluster& c, int max_new) {
    testing::ExpectAllMatch(
        c, [&](uint64_t id) { return ReferenceTokens(c.stages(), Prompt(id), max_new); });
  }

  void ExpectNothingLeft(Cluster& c) { testing::ExpectNothingLeft(c); }

  // Waits until every one of the requests has a mirror on some standby (their first steps ran).
  void AwaitMirrors(Cluster& c, size_t n) {
    ASSERT_TRUE(WaitUntil([&] { return c.TotalStats().kv_mirrors_held >= n; }, 10000))
        << c.TotalStats().kv_mirrors_held << " mirrors";
  }

  std::unique_ptr<directory::DirectoryServer> server_;
};

TEST_F(KvStandbyTest, AKilledStagesRequestsContinueFromItsStandbyWithoutReprefill) {
  auto c = MakeCluster(3, 2);
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 200).ok());
  // Stage 1 and 2 of replica 0 mirror the 8 requests to replica 1's.
  AwaitMirrors(*c, 16);
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().steps_executed > 60; }, 10000));
  c->Kill(1, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 200);
  StageNodeStats s = c->TotalStats();
  EXPECT_EQ(s.reprefills, 0u);
  EXPECT_GT(s.kv_takeovers + s.kv_takeovers_lagged, 0u);
  EXPECT_GT(s.kv_mirrored_bytes, 0u);
  EXPECT_GT(c->engine(1, 1)->imported_positions(), 0u);
  ExpectNothingLeft(*c);
}

TEST_F(KvStandbyTest, ALaggingStandbyRecomputesOnlyItsLag) {
  auto c = MakeCluster(3, 2);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 200).ok());
  AwaitMirrors(*c, 8);
  // Stage 1 of replica 0 stops exporting: its standby falls behind by every step from now on.
  c->engine(1, 0)->SetExportsState(false);
  const uint64_t executed = c->engine(1, 0)->executions();
  ASSERT_TRUE(WaitUntil([&] { return c->engine(1, 0)->executions() > executed + 10; }, 10000));
  c->Kill(1, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 200);
  StageNodeStats s = c->TotalStats();
  EXPECT_EQ(s.reprefills, 0u);
  EXPECT_GT(s.lag_recomputes, 0u);
  EXPECT_GT(s.kv_takeovers_lagged, 0u);
  EXPECT_GT(s.rewound, 0u);  // the other stages cut back to what the standby held
  ExpectNothingLeft(*c);
}

TEST_F(KvStandbyTest, AStandbyOverItsBudgetFallsBackToReprefill) {
  StageNodeOptions o = StandbyOptions();
  o.kv_standby_bytes = 64;  // not even one request's prompt
  auto c = MakeCluster(3, 2, o);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 120).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().kv_mirrors_dropped_for_budget >= 4; }, 10000));
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().steps_executed > 40; }, 10000));
  c->Kill(1, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 120);
  StageNodeStats s = c->TotalStats();
  EXPECT_GT(s.reprefills, 0u);
  EXPECT_EQ(s.kv_takeovers, 0u);
  ExpectNothingLeft(*c);
}

// Requests long enough to outlive the kills and restarts below: the owner's memory is read over
// a slow link (SlowOwner: every step at least 2 ms), so they last seconds however fast the
// machine or slow the sanitizer.
constexpr int kLong = 500;
void SlowOwner(Cluster& c) { c.fabric().SetReadDelay(Lid{c.model(), 0, 0, 0}, 2); }

TEST_F(KvStandbyTest, ADeadStandbyIsReplaced) {
  auto c = MakeCluster(3, 3);
  SlowOwner(*c);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), kLong).ok());
  AwaitMirrors(*c, 12);
  // The standby of stage 1 of replica 0 is replica 1's; it dies, and replica 2's takes its
  // place: it receives the mirrors of replica 0's requests, from position 0.
  c->Kill(1, 1);
  ASSERT_TRUE(WaitUntil([&] { return c->node(1, 2)->stats().kv_mirrors_held >= 6; }, 10000))
      << c->node(1, 2)->stats().kv_mirrors_held << " mirrors on replica 2's stage 1";
  ASSERT_TRUE(c->AwaitMembers(8).ok());  // replica 1's stage 1 is gone from the directory
  c->Kill(1, 0);
  ASSERT_TRUE(c->AwaitAll(120000));
  ExpectAllMatchReference(*c, kLong);
  EXPECT_EQ(c->TotalStats().reprefills, 0u);
  const StageNodeStats taker = c->node(1, 2)->stats();
  EXPECT_GT(taker.kv_takeovers + taker.kv_takeovers_lagged, 0u);
  ExpectNothingLeft(*c);
}

TEST_F(KvStandbyTest, ARestartedStageIsAStandbyAgain) {
  auto c = MakeCluster(3, 2);
  SlowOwner(*c);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), kLong).ok());
  AwaitMirrors(*c, 12);
  c->Kill(1, 0);  // replica 1's stage 1 takes its requests over
  auto taken = [&] {
    const StageNodeStats s = c->node(1, 1)->stats();
    return s.kv_takeovers + s.kv_takeovers_lagged;
  };
  ASSERT_TRUE(WaitUntil([&] { return taken() >= 6; }, 10000)) << taken() << " takeovers";
  // Restarted under its LID, replica 0's stage 1 is the standby of replica 1's again: it
  // receives the mirrors of the requests replica 1's stage 1 now holds, from position 0.
  ASSERT_NE(c->Start(1, 0), nullptr);
  ASSERT_TRUE(WaitUntil([&] { return c->node(1, 0)->stats().kv_mirrors_held >= 6; }, 10000))
      << c->node(1, 0)->stats().kv_mirrors_held << " mirrors on the restarted stage";
  c->Kill(1, 1);  // and takes them back from its mirrors
  ASSERT_TRUE(c->AwaitAll(120000));
  ExpectAllMatchReference(*c, kLong);
  EXPECT_EQ(c->TotalStats().reprefills, 0u);
  const StageNodeStats taker = c->node(1, 0)->stats();
  EXPECT_GT(taker.kv_takeovers + taker.kv_takeovers_lagged, 0u);
  ExpectNothingLeft(*c);
}

TEST_F(KvStandbyTest, AGracefulLeaveHandsItsRequestsToItsStandby) {
  auto c = MakeCluster(3, 2);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 200).ok());
  AwaitMirrors(*c, 12);
  c->Leave(2, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 200);
  EXPECT_EQ(c->TotalStats().reprefills, 0u);
  ExpectNothingLeft(*c);
}

TEST_F(KvStandbyTest, AnEngineThatCannotExportItsStateIsRefusedByName) {
  StageNodeOptions o = StandbyOptions();
  Cluster c(*server_, "kvnoexport", 2, 7, o, [](uint32_t stage, uint32_t stages) {
    auto e = std::make_unique<testing::TestEngine>(stage, stages);
    e->SetExportsState(false);
    return std::unique_ptr<Engine>(std::move(e));
  });
  EXPECT_EQ(c.Start(1, 0), nullptr);
  EXPECT_EQ(c.last_start_error().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(c.last_start_error().message()),
              ::testing::HasSubstr("CONNEX_PP_KV_STANDBY=on needs an engine that exports"));
}

TEST(NextReplicaAfterTest, TheNextLiveReplicaWrappingAroundNeverItself) {
  auto rec = [](uint32_t replica) {
    directory::Record r;
    r.lid = Lid{"m", 1, 0, replica};
    return r;
  };
  EXPECT_EQ(NextReplicaAfter({rec(0), rec(1), rec(2)}, 0)->lid.replica, 1u);
  EXPECT_EQ(NextReplicaAfter({rec(0), rec(2)}, 0)->lid.replica, 2u);
  EXPECT_EQ(NextReplicaAfter({rec(0), rec(1), rec(2)}, 2)->lid.replica, 0u);
  EXPECT_EQ(NextReplicaAfter({rec(1), rec(3)}, 2)->lid.replica, 3u);
  EXPECT_FALSE(NextReplicaAfter({rec(1)}, 1).has_value());
  EXPECT_FALSE(NextReplicaAfter({}, 0).has_value());
}

// A MIRROR whose read hung long enough for the node's follower to take the loop over
// (MirrorStoreOptions::handoff answers false): the store is left alone by the reading thread,
// and the update is applied and answered once the loop ran the rest.
TEST(MirrorStoreTest, AReadThatLostTheLoopIsAppliedAndAnsweredOnTheLoop) {
  auto fabric = transport::mem::Fabric::Create({});
  auto engine_for = [&](const Lid& lid) {
    transport::TransportOptions t;
    t.backend = transport::Backend::kMem;
    t.local_lid = lid;
    t.fabric = fabric;
    return *transport::CreateTransferEngine(t);
  };
  const Lid primary{"m", 1, 0, 0}, standby{"m", 1, 0, 1}, owner{"m", 0, 0, 0};
  transport::TransferEnginePtr primary_transfer = engine_for(primary);
  transport::TransferEnginePtr standby_transfer = engine_for(standby);
  std::unique_ptr<SendRing> ring = *SendRing::Create(*primary_transfer, 2, 1 << 16);
  std::vector<std::pair<std::string, Signal>> sent;
  std::deque<std::function<void()>> loop;
  MirrorStoreOptions o;
  o.self = standby;
  o.slot_bytes = 1 << 16;
  o.handoff.blocking = [](const std::function<void()>& read) {
    read();
    return false;  // taken over meanwhile
  };
  o.handoff.post = [&](std::function<void()> run, std::function<void()>) {
    loop.push_back(std::move(run));
    return true;
  };
  auto store =
      *MirrorStore::Create(o, *standby_transfer,
                           [&](const std::string& a, const Signal& s) { sent.emplace_back(a, s); });
  TensorDict d;
  d.Set("0/k", Tensor::Of<float>({3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6}));
  const uint64_t corr = 41;
  const uint32_t slot = *ring->Acquire(corr);
  MirrorSignal m;
  m.corr = corr;
  m.layout = Pack(d, ring->payload(slot));
  m.length = PackedSize(d);
  ring->Seal(slot, corr, m.length);
  m.origin = Hop{primary, 3, "pp+mem://primary", primary_transfer->LocalAddresses()};
  m.target = standby;
  m.target_epoch = 5;
  m.owner = Hop{owner, 2, "pp+mem://owner", {}};
  m.owner_token = 0x5eed;
  m.request_ids = {7};
  m.from = {0};
  m.to = {3};
  m.remote_addr = ring->remote_addr(slot);
  store->OnMirror(m, /*epoch=*/5, /*now_ms=*/1000);
  ASSERT_EQ(loop.size(), 1u);
  EXPECT_TRUE(sent.empty());  // nothing answered, nothing applied yet
  EXPECT_EQ(store->Held(OwnerKey{owner, 0x5eed}, 7), 0);
  loop.front()();
  ASSERT_EQ(sent.size(), 1u);
  const auto* answer = std::get_if<MirroredSignal>(&sent[0].second);
  ASSERT_NE(answer, nullptr);
  EXPECT_EQ(answer->code, 0u) << answer->message;
  EXPECT_THAT(answer->held, ::testing::ElementsAre(3));
  EXPECT_EQ(store->Held(OwnerKey{owner, 0x5eed}, 7), 3);
  EXPECT_EQ(store->stats().updates, 1u);
}

}  // namespace
}  // namespace connex::pp
