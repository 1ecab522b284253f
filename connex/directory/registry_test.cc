#include "connex/directory/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest() : registry_(&clock_, RegistryOptions{3000, 100, 1024}) {}

  std::vector<Event> Events() { return registry_.TakeEvents(); }

  FakeClock clock_;
  Registry registry_;
  const Lid a_{"demo", 1, 0, 0};
  const Lid b_{"demo", 1, 0, 1};
};

TEST_F(RegistryTest, JoinAssignsAFreshEpochEachTime) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {}, /*instance=*/7);
  ASSERT_TRUE(j1.ok());
  EXPECT_EQ(j1->epoch, 100u);
  auto events = Events();
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].kind, EventKind::kJoined);
  EXPECT_EQ(events[0].revision, 1u);
  EXPECT_EQ(events[0].record.epoch, 100u);

  ASSERT_TRUE(registry_.Leave(a_, j1->epoch).ok());
  auto j2 = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  ASSERT_TRUE(j2.ok());
  EXPECT_GT(j2->epoch, j1->epoch);
  events = Events();
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].kind, EventKind::kLeft);
  EXPECT_EQ(events[1].kind, EventKind::kJoined);
  EXPECT_EQ(events[1].revision, 3u);
}

TEST_F(RegistryTest, RepeatedJoinByHolderIsIdempotent) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  auto j2 = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  ASSERT_TRUE(j1.ok() && j2.ok());
  EXPECT_EQ(j1->epoch, j2->epoch);
  EXPECT_FALSE(j2->changed);
  EXPECT_THAT(Events(), SizeIs(1));
}

TEST_F(RegistryTest, JoinWithNewAddressesByHolderIsAMigration) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  auto j2 = registry_.Join(a_, {"tcp://h:2"}, {}, 7);
  ASSERT_TRUE(j1.ok() && j2.ok());
  EXPECT_GT(j2->epoch, j1->epoch);
  auto events = Events();
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[1].kind, EventKind::kMigrated);
  EXPECT_EQ(events[1].previous_epoch, j1->epoch);
  EXPECT_EQ(events[1].record.addresses, std::vector<std::string>{"tcp://h:2"});
  // The old epoch is fenced.
  EXPECT_EQ(*registry_.Heartbeat(a_, j1->epoch, 7), j2->epoch);  // the holder adopts it
  EXPECT_TRUE(registry_.Heartbeat(a_, j2->epoch, 7).ok());
  EXPECT_EQ(registry_.Heartbeat(a_, j2->epoch, 8).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, JoinByAnotherProcessSupersedesTheHolder) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  auto j2 = registry_.Join(a_, {"tcp://h:9"}, {}, 8);
  ASSERT_TRUE(j1.ok() && j2.ok());
  auto events = Events();
  ASSERT_THAT(events, SizeIs(3));
  EXPECT_EQ(events[1].kind, EventKind::kFailed);
  EXPECT_EQ(events[1].record.epoch, j1->epoch);
  EXPECT_THAT(events[1].reason, HasSubstr("superseded by epoch"));
  EXPECT_EQ(events[2].kind, EventKind::kJoined);
  absl::Status hb = registry_.Heartbeat(a_, j1->epoch, 7).status();
  EXPECT_EQ(hb.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(hb.message()), HasSubstr("superseded by " + std::to_string(j2->epoch)));
  EXPECT_TRUE(registry_.Heartbeat(a_, j2->epoch, 8).ok());
}

TEST_F(RegistryTest, HeartbeatOfAnEarlierEpochLearnsTheLaterOne) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  auto j2 = registry_.Join(a_, {"tcp://h:2"}, {}, 7);  // its reply was lost
  ASSERT_TRUE(j1.ok() && j2.ok());
  absl::StatusOr<uint64_t> held = registry_.Heartbeat(a_, j1->epoch, 7);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, j2->epoch);
  EXPECT_EQ(registry_.Heartbeat(a_, j2->epoch + 1, 7).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, ExclusiveJoinDoesNotSupersede) {
  ASSERT_TRUE(registry_.Join(a_, {"tcp://h:1"}, {}, 7).ok());
  auto j = registry_.Join(a_, {"tcp://h:9"}, {}, 8, /*exclusive=*/true);
  EXPECT_EQ(j.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, LeaseExpiresWithoutHeartbeats) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  ASSERT_TRUE(j.ok());
  Events();
  clock_.AdvanceMs(2000);
  ASSERT_TRUE(registry_.Heartbeat(a_, j->epoch, 7).ok());
  clock_.AdvanceMs(2999);
  registry_.ExpireLeases();
  EXPECT_TRUE(Events().empty());
  EXPECT_EQ(*registry_.MsUntilNextExpiry(), 1);
  clock_.AdvanceMs(1);
  registry_.ExpireLeases();
  auto events = Events();
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].kind, EventKind::kFailed);
  EXPECT_EQ(events[0].reason, "lease-expired");
  EXPECT_EQ(registry_.size(), 0u);
  // The evicted holder learns it and may join again.
  absl::Status hb = registry_.Heartbeat(a_, j->epoch, 7).status();
  EXPECT_EQ(hb.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(hb.message()), HasSubstr("was evicted"));
}

TEST_F(RegistryTest, EvictedHolderIsRefusedOnceReplaced) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  clock_.AdvanceMs(3000);
  registry_.ExpireLeases();
  auto replacement = registry_.Join(a_, {"tcp://h:2"}, {}, 8);
  ASSERT_TRUE(replacement.ok());
  EXPECT_EQ(registry_.Heartbeat(a_, j->epoch, 7).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, ReportFailedEvictsThatEpochOnly) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  Events();
  EXPECT_FALSE(*registry_.ReportFailed(a_, j->epoch + 1, "x"));  // stale report: nothing to do
  EXPECT_TRUE(*registry_.ReportFailed(a_, j->epoch, "owner"));
  auto events = Events();
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].kind, EventKind::kFailed);
  EXPECT_EQ(events[0].reason, "reported by owner");
  EXPECT_EQ(registry_.ReportFailed(a_, 0, "x").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RegistryTest, LeaveWithWrongEpochIsRefused) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {}, 7);
  EXPECT_EQ(registry_.Leave(a_, j->epoch + 5).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Leave(b_, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry_.Leave(a_, 0).ok());
  EXPECT_EQ(registry_.Heartbeat(a_, j->epoch, 7).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, RejectsBadRegistrations) {
  EXPECT_EQ(registry_.Join(a_, {"no-scheme"}, {}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::string> many(kMaxAddresses + 1, "tcp://h:1");
  EXPECT_EQ(registry_.Join(a_, many, {}, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.size(), 0u);
  EXPECT_EQ(registry_.revision(), 0u);
}

TEST_F(RegistryTest, SnapshotFiltersAndCarriesLeases) {
  registry_.Join(a_, {"tcp://h:1"}, {}, 1).IgnoreError();
  registry_.Join(b_, {"tcp://h:2"}, {}, 2).IgnoreError();
  registry_.Join(Lid{"other", 0, 0, 0}, {"tcp://h:3"}, {}, 3).IgnoreError();
  clock_.AdvanceMs(1000);
  Snapshot s = registry_.Snap(5, "demo", 1);
  EXPECT_EQ(s.incarnation, 5u);
  EXPECT_EQ(s.revision, 3u);
  ASSERT_THAT(s.records, SizeIs(2));
  EXPECT_EQ(s.records[0].lid, a_);
  EXPECT_EQ(s.records[0].lease_left_ms, 2000);
  EXPECT_THAT(registry_.Snap(5).records, SizeIs(3));
}

}  // namespace
}  // namespace connex::directory
