#include "connex/elastic/group_view.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::elastic {
namespace {

using directory::Event;
using directory::EventKind;
using directory::Record;

Lid R(uint32_t replica, uint32_t group = 1) { return Lid{"demo", group, 0, replica}; }

Record Rec(const Lid& lid, uint64_t epoch, std::vector<std::string> addresses = {}) {
  Record r;
  r.lid = lid;
  r.epoch = epoch;
  r.addresses =
      addresses.empty()
          ? std::vector<std::string>{"mem://" + lid.ToString() + "@" + std::to_string(epoch)}
          : std::move(addresses);
  return r;
}

Event Ev(EventKind kind, Record r, uint64_t previous_epoch = 0) {
  Event e;
  e.kind = kind;
  e.record = std::move(r);
  e.previous_epoch = previous_epoch;
  return e;
}

GroupViewOptions Options(uint32_t own_replica = 0) {
  GroupViewOptions o;
  o.model = "demo";
  o.group = 1;
  o.own_replica = own_replica;
  return o;
}

Lid Picked(const GroupView& view, const Lid* current = nullptr) {
  const Record* r = view.Pick(current);
  return r != nullptr ? r->lid : Lid{};
}

TEST(GroupViewTest, StickyPickThenOwnReplicaThenNextAfterItWrapping) {
  GroupView view(Options(/*own_replica=*/1));
  EXPECT_EQ(view.Pick(nullptr), nullptr);
  for (uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(view.ApplyRecord(Rec(R(r), 10 + r)));
  EXPECT_EQ(Picked(view), R(1));  // own replica
  const Lid r2 = R(2), r0 = R(0), r7 = R(7);
  EXPECT_EQ(Picked(view, &r2), R(2));  // sticky: the request's current peer
  EXPECT_EQ(Picked(view, &r0), R(0));
  EXPECT_EQ(Picked(view, &r7), R(1));  // current is not live: own replica
  ASSERT_TRUE(view.Evict(R(1), 0, "test"));
  EXPECT_EQ(Picked(view), R(2));  // the next after the own replica
  ASSERT_TRUE(view.Evict(R(2), 0, "test"));
  EXPECT_EQ(Picked(view), R(0));  // wrapping around
  // A migration keeps a sticky pick (same LID, new epoch).
  ASSERT_TRUE(view.Apply(Ev(EventKind::kMigrated, Rec(R(0), 20), 10)));
  EXPECT_EQ(view.Pick(&r0)->epoch, 20u);
}

TEST(GroupViewTest, LeftIsDrainingNotFailedAndNeverPicked) {
  GroupView view(Options(1));
  ASSERT_TRUE(view.ApplyRecord(Rec(R(0), 1)));
  ASSERT_TRUE(view.ApplyRecord(Rec(R(1), 2)));
  std::optional<PeerChange> left = view.Apply(Ev(EventKind::kLeft, Rec(R(1), 2)));
  ASSERT_TRUE(left);
  EXPECT_EQ(left->kind, PeerChange::Kind::kLeft);
  EXPECT_EQ(view.StateOf(R(1), 2), PeerState::kDraining);
  EXPECT_FALSE(view.IsUsable(R(1), 2));
  const Lid r1 = R(1);
  EXPECT_EQ(Picked(view, &r1), R(0));  // not even for a request that was on it
  std::vector<PeerInfo> members = view.Members();
  ASSERT_EQ(members.size(), 2u);
  EXPECT_EQ(members[1].state, PeerState::kDraining);
  // The draining process dies (its connection closes): in-flight work is lost now.
  EXPECT_EQ(view.EpochOfAddress(R(1), "mem://demo/g1/s0/r1@2"), 2u);
  std::optional<PeerChange> failed = view.Evict(R(1), 2, "transport: closed");
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->kind, PeerChange::Kind::kFailed);
  EXPECT_TRUE(failed->local);
  EXPECT_EQ(view.StateOf(R(1), 2), PeerState::kFailed);
  EXPECT_FALSE(view.Evict(R(1), 2, "again"));  // announced once
}

TEST(GroupViewTest, AnAddressMapsToItsIncarnationOnly) {
  GroupView view(Options());
  ASSERT_TRUE(view.ApplyRecord(Rec(R(1), 5, {"zmq+tcp://h:1", "mem://old"})));
  EXPECT_EQ(view.EpochOfAddress(R(1), "mem://old"), 5u);
  // The process dies and restarts under the same LID at a new address.
  ASSERT_TRUE(view.Apply(Ev(EventKind::kFailed, Rec(R(1), 5))));
  ASSERT_TRUE(view.Apply(Ev(EventKind::kJoined, Rec(R(1), 9, {"zmq+tcp://h:2", "mem://new"}))));
  EXPECT_EQ(view.EpochOfAddress(R(1), "mem://old"), std::nullopt);  // late event: not the new one
  EXPECT_EQ(view.EpochOfAddress(R(1), "mem://new"), 9u);
  EXPECT_EQ(view.EpochOfAddress(R(1), ""), 9u);  // a backend that names no address
  EXPECT_EQ(view.EpochOfAddress(R(2), "mem://new"), std::nullopt);
}

TEST(GroupViewTest, LocalEvictionIsNotUndoneByALaggingDirectory) {
  GroupView view(Options());
  ASSERT_TRUE(view.ApplyRecord(Rec(R(1), 5)));
  ASSERT_TRUE(view.Evict(R(1), 5, "MarkFailed"));
  // A resnapshot taken before the directory processed the report still lists epoch 5.
  EXPECT_FALSE(view.ApplyRecord(Rec(R(1), 5)));
  EXPECT_FALSE(view.IsUsable(R(1), 5));
  EXPECT_EQ(view.remembered_count(), 1u);
  // The directory's FAILED for it: announced already (locally), still failed.
  EXPECT_FALSE(view.Apply(Ev(EventKind::kFailed, Rec(R(1), 5))));
  EXPECT_EQ(view.StateOf(R(1), 5), PeerState::kFailed);
  EXPECT_EQ(view.remembered_count(), 1u);
  // Stale events of superseded epochs are ignored.
  ASSERT_TRUE(view.Apply(Ev(EventKind::kJoined, Rec(R(1), 7))));
  EXPECT_EQ(view.remembered_count(), 0u);  // epoch 7 supersedes epoch 5
  EXPECT_FALSE(view.Apply(Ev(EventKind::kJoined, Rec(R(1), 6))));
  EXPECT_FALSE(view.Apply(Ev(EventKind::kLeft, Rec(R(1), 6))));
  EXPECT_TRUE(view.IsUsable(R(1), 7));
}

TEST(GroupViewTest, RememberedIncarnationsAreBounded) {
  GroupViewOptions o = Options();
  o.max_remembered = 3;
  GroupView view(o);
  for (uint32_t r = 0; r < 10; ++r) {
    ASSERT_TRUE(view.ApplyRecord(Rec(R(r), 100 + r)));
    ASSERT_TRUE(view.Apply(Ev(EventKind::kLeft, Rec(R(r), 100 + r))));
  }
  EXPECT_EQ(view.remembered_count(), 3u);  // the newest three
  EXPECT_EQ(view.StateOf(R(9), 109), PeerState::kDraining);
  EXPECT_EQ(view.StateOf(R(0), 100), PeerState::kUnknown);
  // A new incarnation of a LID supersedes what is remembered of it.
  ASSERT_TRUE(view.ApplyRecord(Rec(R(9), 200)));
  EXPECT_EQ(view.remembered_count(), 2u);
  EXPECT_EQ(view.StateOf(R(9), 109), PeerState::kUnknown);
  // Evictions churning one LID stay bounded too.
  for (uint64_t e = 300; e < 400; ++e) {
    ASSERT_TRUE(view.Apply(Ev(EventKind::kJoined, Rec(R(5), e))));
    ASSERT_TRUE(view.Evict(R(5), e, "churn"));
  }
  EXPECT_LE(view.remembered_count(), 3u);
  EXPECT_EQ(view.Members().size(), view.live_count() + view.remembered_count());
}

TEST(GroupViewTest, MembershipFilters) {
  GroupViewOptions o = Options();
  o.shard = 0;
  o.member_address_prefix = "pp+";
  GroupView view(o);
  EXPECT_FALSE(view.ApplyRecord(Rec(R(0, 2), 1, {"pp+tcp://h:1"})));               // other group
  EXPECT_FALSE(view.ApplyRecord(Rec(Lid{"else", 1, 0, 0}, 1, {"pp+tcp://h:1"})));  // model
  EXPECT_FALSE(view.ApplyRecord(Rec(Lid{"demo", 1, 1, 0}, 1, {"pp+tcp://h:1"})));  // shard
  EXPECT_FALSE(view.ApplyRecord(Rec(R(0), 1, {"zmq+tcp://h:1"})));                 // no pp+
  EXPECT_TRUE(view.ApplyRecord(Rec(R(1), 2, {"pp+tcp://h:1", "mem://x"})));
  EXPECT_EQ(view.live_count(), 1u);
  // Superseded by an incarnation that is not a member: the old one is gone.
  std::optional<PeerChange> gone =
      view.Apply(Ev(EventKind::kMigrated, Rec(R(1), 3, {"zmq+tcp://h:2"}), 2));
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->kind, PeerChange::Kind::kFailed);
  EXPECT_EQ(view.live_count(), 0u);
}

TEST(GroupViewTest, SuspicionIsRecordedOnceAndCleared) {
  GroupView view(Options());
  ASSERT_TRUE(view.ApplyRecord(Rec(R(1), 4)));
  std::optional<PeerChange> s = view.Suspect(R(1), 4, "transport: no heartbeat");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, PeerChange::Kind::kSuspected);
  EXPECT_FALSE(view.Suspect(R(1), 4, "again"));
  EXPECT_FALSE(view.Suspect(R(1), 3, "another epoch"));
  EXPECT_TRUE(view.IsUsable(R(1), 4));  // a suspicion is not an eviction
  EXPECT_TRUE(view.Members()[0].suspected);
  view.ClearSuspicion(R(1), 4);
  EXPECT_FALSE(view.Members()[0].suspected);
  EXPECT_TRUE(view.Suspect(R(1), 4, "later"));
}

}  // namespace
}  // namespace connex::elastic
