#include "connex/directory/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

RegistryOptions TestOptions() {
  RegistryOptions o;
  o.lease_ttl_ms = 3000;
  o.first_epoch = 100;
  o.max_tombstones = 1024;
  o.admin_token = "admin-secret";
  return o;
}

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest() : registry_(&clock_, TestOptions()) {}

  std::vector<Event> Events() { return registry_.TakeEvents(); }

  // The holder of `j`'s incarnation.
  static JoinAuth As(const absl::StatusOr<Registry::JoinResult>& j) {
    JoinAuth auth;
    auth.credential = j.ok() ? j->credential : "";
    return auth;
  }
  static Caller Holder(const absl::StatusOr<Registry::JoinResult>& j) {
    Caller c;
    c.credential = j.ok() ? j->credential : "";
    return c;
  }
  static Caller Member(const Lid& lid, const absl::StatusOr<Registry::JoinResult>& j,
                       std::string name = "") {
    Caller c;
    c.member = lid;
    c.member_credential = j.ok() ? j->credential : "";
    c.name = std::move(name);
    return c;
  }
  static Caller Admin() {
    Caller c;
    c.admin_token = "admin-secret";
    return c;
  }

  FakeClock clock_;
  Registry registry_;
  const Lid a_{"demo", 1, 0, 0};
  const Lid b_{"demo", 1, 0, 1};
  const Lid c_{"demo", 0, 0, 0};
};

TEST_F(RegistryTest, JoinAssignsAFreshEpochAndCredentialEachTime) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j1.ok());
  EXPECT_EQ(j1->epoch, 100u);
  EXPECT_EQ(j1->credential.size(), 32u);
  auto events = Events();
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].kind, EventKind::kJoined);
  EXPECT_EQ(events[0].revision, 1u);
  EXPECT_EQ(events[0].record.epoch, 100u);

  ASSERT_TRUE(registry_.Leave(a_, j1->epoch, Holder(j1)).ok());
  auto j2 = registry_.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j2.ok());
  EXPECT_GT(j2->epoch, j1->epoch);
  EXPECT_NE(j2->credential, j1->credential);
  events = Events();
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].kind, EventKind::kLeft);
  EXPECT_EQ(events[1].kind, EventKind::kJoined);
  EXPECT_EQ(events[1].revision, 3u);
}

TEST_F(RegistryTest, RepeatedJoinByHolderIsIdempotent) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  auto j2 = registry_.Join(a_, {"tcp://h:1"}, {}, As(j1));
  ASSERT_TRUE(j1.ok() && j2.ok());
  EXPECT_EQ(j1->epoch, j2->epoch);
  EXPECT_EQ(j1->credential, j2->credential);
  EXPECT_FALSE(j2->changed);
  EXPECT_THAT(Events(), SizeIs(1));
}

TEST_F(RegistryTest, JoinWithNewAddressesByHolderIsAMigration) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  auto j2 = registry_.Join(a_, {"tcp://h:2"}, {}, As(j1));
  ASSERT_TRUE(j1.ok() && j2.ok());
  EXPECT_GT(j2->epoch, j1->epoch);
  EXPECT_NE(j2->credential, j1->credential);  // a new incarnation
  auto events = Events();
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[1].kind, EventKind::kMigrated);
  EXPECT_EQ(events[1].previous_epoch, j1->epoch);
  EXPECT_EQ(events[1].record.addresses, std::vector<std::string>{"tcp://h:2"});
  // The holder that missed the reply adopts the new incarnation from its next heartbeat.
  auto adopted = registry_.Heartbeat(a_, j1->epoch, j1->credential);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->epoch, j2->epoch);
  EXPECT_EQ(adopted->credential, j2->credential);
  auto renewed = registry_.Heartbeat(a_, j2->epoch, j2->credential);
  ASSERT_TRUE(renewed.ok());
  EXPECT_TRUE(renewed->credential.empty());
  EXPECT_EQ(registry_.Heartbeat(a_, j2->epoch, "guess").status().code(),
            absl::StatusCode::kPermissionDenied);
}

// Finding 1 of issue 12: a second JOIN of a live holder's LID took it over (the holder gave up,
// watchers saw FAILED then JOINED at the impostor's address).
TEST_F(RegistryTest, JoinOfALiveHoldersLidIsRefused) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j1.ok());
  Events();
  clock_.AdvanceMs(700);
  auto impostor = registry_.Join(a_, {"tcp://6.6.6.6:666"}, {});
  EXPECT_EQ(impostor.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(impostor.status().message()),
              HasSubstr("held by epoch 100 (lease live, 2300 ms left"));
  // A guessed credential is no better than none.
  JoinAuth guess;
  guess.credential = std::string(32, '0');
  EXPECT_EQ(registry_.Join(a_, {"tcp://6.6.6.6:666"}, {}, guess).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Forcing needs the admin token.
  JoinAuth forced;
  forced.force = true;
  EXPECT_EQ(registry_.Join(a_, {"tcp://6.6.6.6:666"}, {}, forced).status().code(),
            absl::StatusCode::kPermissionDenied);
  forced.admin_token = "wrong";
  EXPECT_EQ(registry_.Join(a_, {"tcp://6.6.6.6:666"}, {}, forced).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Events().empty());
  EXPECT_TRUE(registry_.Heartbeat(a_, j1->epoch, j1->credential).ok());
}

TEST_F(RegistryTest, ForcedJoinSupersedesAndFencesTheHolder) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  JoinAuth forced;
  forced.force = true;
  forced.admin_token = "admin-secret";
  auto j2 = registry_.Join(a_, {"tcp://h:9"}, {}, forced);
  ASSERT_TRUE(j1.ok() && j2.ok()) << j2.status();
  auto events = Events();
  ASSERT_THAT(events, SizeIs(3));
  EXPECT_EQ(events[1].kind, EventKind::kFailed);
  EXPECT_EQ(events[1].record.epoch, j1->epoch);
  EXPECT_THAT(events[1].reason, HasSubstr("superseded by epoch"));
  EXPECT_EQ(events[2].kind, EventKind::kJoined);
  absl::Status hb = registry_.Heartbeat(a_, j1->epoch, j1->credential).status();
  EXPECT_EQ(hb.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(hb.message()), HasSubstr("superseded by " + std::to_string(j2->epoch)));
  EXPECT_TRUE(registry_.Heartbeat(a_, j2->epoch, j2->credential).ok());
  // The fenced holder can neither migrate nor leave the LID.
  EXPECT_EQ(registry_.Join(a_, {"tcp://h:2"}, {}, As(j1)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry_.Leave(a_, j1->epoch, Holder(j1)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, JoinOfAnExpiredLeaseTakesTheLid) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j1.ok());
  Events();
  clock_.AdvanceMs(3000);  // no sweep yet: the JOIN notices the lease ran out
  auto j2 = registry_.Join(a_, {"tcp://h:2"}, {});
  ASSERT_TRUE(j2.ok()) << j2.status();
  auto events = Events();
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].kind, EventKind::kFailed);
  EXPECT_EQ(events[0].reason, "lease-expired");
  EXPECT_EQ(events[1].kind, EventKind::kJoined);
}

// Found by the pp campaign under load: the expired record's neighbour in the table (the next LID)
// was taken for the holder, so a JOIN of a free LID was refused as "held by" the neighbour's
// epoch with a negative lease left.
TEST_F(RegistryTest, JoinOfAnExpiredLeaseIsNotJudgedByTheNextLidsRecord) {
  auto ja = registry_.Join(a_, {"tcp://h:1"}, {});
  clock_.AdvanceMs(1000);
  auto jb = registry_.Join(b_, {"tcp://h:2"}, {});  // the LID after a_ in the table
  ASSERT_TRUE(ja.ok() && jb.ok());
  Events();
  clock_.AdvanceMs(2000);  // a_'s lease ran out (no sweep yet), b_'s has 1000 ms left
  auto stranger = registry_.Join(a_, {"tcp://h:3"}, {});
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  EXPECT_GT(stranger->epoch, jb->epoch);
  // The old holder of a_, back (a migration after its eviction), is now the stranger's rival;
  // the one refused is it, about a_'s live record, not b_'s.
  auto back = registry_.Join(a_, {"tcp://h:4"}, {}, As(ja));
  EXPECT_EQ(back.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(back.status().message()),
              HasSubstr("held by epoch " + std::to_string(stranger->epoch) + " (lease live, 3000"));
  // b_ was left alone: its holder renews it.
  EXPECT_TRUE(registry_.Heartbeat(b_, jb->epoch, jb->credential).ok());
  auto events = Events();
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].kind, EventKind::kFailed);
  EXPECT_EQ(events[0].record.lid, a_);
  EXPECT_EQ(events[1].kind, EventKind::kJoined);
  EXPECT_EQ(events[1].record.lid, a_);
}

// The old holder's own JOIN after its lease ran out (unswept), the LID's neighbour live: a new
// incarnation for it, as after an eviction.
TEST_F(RegistryTest, TheHoldersJoinAfterItsLeaseRanOutIsANewIncarnation) {
  auto ja = registry_.Join(a_, {"tcp://h:1"}, {});
  clock_.AdvanceMs(1000);
  auto jb = registry_.Join(b_, {"tcp://h:2"}, {});
  ASSERT_TRUE(ja.ok() && jb.ok());
  clock_.AdvanceMs(2000);
  auto back = registry_.Join(a_, {"tcp://h:9"}, {}, As(ja));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_GT(back->epoch, jb->epoch);
  EXPECT_TRUE(back->changed);
}

TEST_F(RegistryTest, HeartbeatOfAnUnknownLaterEpochIsRefused) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j1.ok());
  EXPECT_EQ(registry_.Heartbeat(a_, j1->epoch + 1, j1->credential).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, ExclusiveJoinDoesNotSupersede) {
  ASSERT_TRUE(registry_.Join(a_, {"tcp://h:1"}, {}).ok());
  JoinAuth exclusive;
  exclusive.exclusive = true;
  auto j = registry_.Join(a_, {"tcp://h:9"}, {}, exclusive);
  EXPECT_EQ(j.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, LeaseExpiresWithoutHeartbeats) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j.ok());
  Events();
  clock_.AdvanceMs(2000);
  ASSERT_TRUE(registry_.Heartbeat(a_, j->epoch, j->credential).ok());
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
  absl::Status hb = registry_.Heartbeat(a_, j->epoch, j->credential).status();
  EXPECT_EQ(hb.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(hb.message()), HasSubstr("was evicted"));
}

TEST_F(RegistryTest, EvictedHolderIsRefusedOnceReplaced) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {});
  clock_.AdvanceMs(3000);
  registry_.ExpireLeases();
  auto replacement = registry_.Join(a_, {"tcp://h:2"}, {});
  ASSERT_TRUE(replacement.ok());
  EXPECT_EQ(registry_.Heartbeat(a_, j->epoch, j->credential).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, ReportFailedFromAMemberEvictsThatEpochOnly) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {});
  auto owner = registry_.Join(c_, {"tcp://h:0"}, {});
  ASSERT_TRUE(j.ok() && owner.ok());
  Events();
  // A stale report: nothing to do.
  EXPECT_FALSE(*registry_.ReportFailed(a_, j->epoch + 1, Member(c_, owner, "x")));
  auto evicted = registry_.ReportFailed(a_, j->epoch, Member(c_, owner, "owner"));
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_TRUE(*evicted);
  auto events = Events();
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].kind, EventKind::kFailed);
  EXPECT_EQ(events[0].reason, "reported by demo/g0/s0/r0 epoch 101 (owner)");
  EXPECT_EQ(registry_.ReportFailed(a_, 0, Member(c_, owner)).status().code(),
            absl::StatusCode::kNotFound);
}

// Issue 23: a member's failure reports evicted live stages 4,323 times in 6 s. A member reports
// only about the groups its record says it deals with, and within a budget; the operator is not
// limited.
TEST_F(RegistryTest, AMembersReportsAreScopedToItsPeerGroupsAndRateLimited) {
  // A stage 1 that deals with groups 0 and 2 (as a pp stage publishes it).
  const Lid reporter{"demo", 1, 0, 5};
  auto r = registry_.Join(reporter, {"tcp://h:9"}, {{std::string(kPeerGroupsKey), "0,2"}});
  ASSERT_TRUE(r.ok());
  std::vector<Lid> stage2, stage3;
  for (uint32_t i = 0; i < 20; ++i) {
    stage2.push_back(Lid{"demo", 2, 0, i});
    stage3.push_back(Lid{"demo", 3, 0, i});
    ASSERT_TRUE(registry_.Join(stage2.back(), {"tcp://h:2"}, {}).ok());
    ASSERT_TRUE(registry_.Join(stage3.back(), {"tcp://h:3"}, {}).ok());
  }
  // Group 3 is none of its business.
  absl::Status scoped = registry_.ReportFailed(stage3[0], 0, Member(reporter, r)).status();
  EXPECT_EQ(scoped.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(scoped.message()), HasSubstr("deals with groups 0,2"));
  // A burst of 8, then one more per 500 ms.
  int taken = 0;
  for (int i = 0; i < 20; ++i)
    taken += registry_.ReportFailed(stage2[i], 0, Member(reporter, r)).ok();
  EXPECT_EQ(taken, static_cast<int>(kReportBurst));
  absl::Status limited = registry_.ReportFailed(stage2[19], 0, Member(reporter, r)).status();
  EXPECT_EQ(limited.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(limited.message()), HasSubstr("reports too often"));
  clock_.AdvanceMs(500);
  EXPECT_TRUE(registry_.ReportFailed(stage2[19], 0, Member(reporter, r)).ok());
  EXPECT_EQ(registry_.ReportFailed(stage2[18], 0, Member(reporter, r)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // The operator reports anything, as often as it must.
  for (int i = 1; i < 20; ++i) EXPECT_TRUE(registry_.ReportFailed(stage3[i], 0, Admin()).ok());
}

// Finding 1 of issue 12: 26 stranger REPORT_FAILEDs in 2.6 s made 36 failovers.
TEST_F(RegistryTest, ReportFailedFromAStrangerIsRefused) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {});
  auto other_model = registry_.Join(Lid{"junk", 0, 0, 0}, {"tcp://h:0"}, {});
  ASSERT_TRUE(j.ok() && other_model.ok());
  Events();
  Caller stranger;
  stranger.name = "connexctl";
  absl::Status refused = registry_.ReportFailed(a_, 0, stranger).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("reporter 'connexctl' holds no LID"));
  // A member of another model, a forged credential, a wrong admin token: refused too.
  EXPECT_EQ(
      registry_.ReportFailed(a_, 0, Member(Lid{"junk", 0, 0, 0}, other_model)).status().code(),
      absl::StatusCode::kPermissionDenied);
  Caller forged = Member(b_, j);
  EXPECT_EQ(registry_.ReportFailed(a_, 0, forged).status().code(),
            absl::StatusCode::kPermissionDenied);
  Caller wrong_admin;
  wrong_admin.admin_token = "nope";
  EXPECT_EQ(registry_.ReportFailed(a_, 0, wrong_admin).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A member whose own lease ran out is no longer a member.
  auto c = registry_.Join(c_, {"tcp://h:0"}, {});
  ASSERT_TRUE(c.ok());
  Events();
  clock_.AdvanceMs(2000);
  ASSERT_TRUE(registry_.Heartbeat(a_, j->epoch, j->credential).ok());
  clock_.AdvanceMs(1500);
  EXPECT_EQ(registry_.ReportFailed(a_, 0, Member(c_, c)).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Events().empty());
  // The operator may.
  EXPECT_TRUE(*registry_.ReportFailed(a_, 0, Admin()));
}

// Finding 1 of issue 12: a stranger's `connexctl leave` removed a live holder for good.
TEST_F(RegistryTest, LeaveNeedsTheHoldersCredentialOrTheAdminToken) {
  auto j = registry_.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j.ok());
  absl::Status stranger = registry_.Leave(a_, 0, Caller{});
  EXPECT_EQ(stranger.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(stranger.message()), HasSubstr("needs the holder's credential"));
  Caller guess;
  guess.credential = "0123";
  EXPECT_EQ(registry_.Leave(a_, 0, guess).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry_.Leave(a_, j->epoch + 5, Holder(j)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Leave(b_, 0, Admin()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.size(), 1u);
  EXPECT_TRUE(registry_.Leave(a_, 0, Admin()).ok());  // an operator's drain
  EXPECT_EQ(registry_.Heartbeat(a_, j->epoch, j->credential).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, WithoutAnAdminTokenNothingIsAnOperators) {
  Registry open(&clock_, RegistryOptions{});
  auto j = open.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j.ok());
  Caller empty_admin;  // an empty token never matches the (empty) admin token
  EXPECT_EQ(open.Leave(a_, 0, empty_admin).code(), absl::StatusCode::kPermissionDenied);
  JoinAuth forced;
  forced.force = true;
  forced.admin_token = "anything";
  absl::Status refused = open.Join(a_, {"tcp://h:2"}, {}, forced).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("this directory has none"));
}

// A holder whose JOIN of a free LID (a rejoin, or a JOIN after a directory restart) was applied
// but whose reply was lost still finds its new incarnation from its next heartbeat; before, it
// was told "superseded" and gave its LID up (found by
// EpochsNeverRepeatAcrossRestartsAndClockSteps).
TEST_F(RegistryTest, HeartbeatAfterALostJoinReplyOfAFreeLidAdoptsIt) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  ASSERT_TRUE(j1.ok());
  ASSERT_TRUE(*registry_.ReportFailed(a_, 0, Admin()));
  auto j2 = registry_.Join(a_, {"tcp://h:1"}, {}, As(j1));  // its reply is lost
  ASSERT_TRUE(j2.ok());
  auto adopted = registry_.Heartbeat(a_, j1->epoch, j1->credential);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->epoch, j2->epoch);
  EXPECT_EQ(adopted->credential, j2->credential);
}

TEST_F(RegistryTest, EpochsDoNotFollowTheClockAndSurviveARestore) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {});
  clock_.AdvanceMs(-500'000);  // stepped back
  auto j2 = registry_.Join(a_, {"tcp://h:2"}, {}, As(j1));
  ASSERT_TRUE(j1.ok() && j2.ok());
  EXPECT_GT(j2->epoch, j1->epoch);
  Registry restarted(&clock_, TestOptions());  // first_epoch 100 again
  restarted.Restore(registry_.Export());
  auto j3 = restarted.Join(b_, {"tcp://h:3"}, {});
  ASSERT_TRUE(j3.ok());
  EXPECT_GT(j3->epoch, j2->epoch);
}

TEST_F(RegistryTest, RestoreBringsRecordsBackWithFullLeasesAndNoEvents) {
  auto j1 = registry_.Join(a_, {"tcp://h:1"}, {{"k", "v"}});
  auto j2 = registry_.Join(b_, {"tcp://h:2"}, {});
  auto j3 = registry_.Join(b_, {"tcp://h:3"}, {}, As(j2));  // migrated
  ASSERT_TRUE(j1.ok() && j2.ok() && j3.ok());
  clock_.AdvanceMs(2500);
  RegistryState saved = registry_.Export();
  Registry restarted(&clock_, TestOptions());
  restarted.Restore(saved);
  EXPECT_TRUE(restarted.TakeEvents().empty());
  EXPECT_EQ(restarted.revision(), registry_.revision());
  Snapshot s = restarted.Snap(1);
  ASSERT_THAT(s.records, SizeIs(2));
  EXPECT_EQ(s.records[0].epoch, j1->epoch);
  EXPECT_EQ(s.records[0].metadata.at("k"), "v");
  EXPECT_EQ(s.records[0].lease_left_ms, 3000);  // the downtime is not held against holders
  EXPECT_EQ(s.records[1].epoch, j3->epoch);
  // Holders carry on with their credentials: heartbeats, a lost migration reply, leaving.
  EXPECT_TRUE(restarted.Heartbeat(a_, j1->epoch, j1->credential).ok());
  EXPECT_EQ(restarted.Heartbeat(b_, j2->epoch, j2->credential)->epoch, j3->epoch);
  EXPECT_EQ(restarted.Join(a_, {"tcp://h:9"}, {}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(restarted.Leave(b_, j3->epoch, Holder(j3)).ok());
  auto events = restarted.TakeEvents();
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].revision, registry_.revision() + 1);
}

// Finding 2 of issue 12: records per model and in total were unbounded (520 maximal records in
// model `junk` starved `prod`; 130 large records made a snapshot no client accepts).
TEST_F(RegistryTest, TableLimitsAreEnforcedAndNamed) {
  RegistryOptions o = TestOptions();
  o.max_records = 5;
  o.max_records_per_model = 3;
  o.max_record_bytes = 512;
  Registry limited(&clock_, o);
  std::vector<Registry::JoinResult> junk;
  for (uint32_t r = 0; r < 3; ++r) {
    auto j = limited.Join(Lid{"junk", 0, 0, r}, {"tcp://h:1"}, {});
    ASSERT_TRUE(j.ok()) << j.status();
    junk.push_back(*j);
  }
  absl::Status full = limited.Join(Lid{"junk", 0, 0, 3}, {"tcp://h:1"}, {}).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()),
              HasSubstr("model 'junk' has 3 records, the limit (--max-records-per-model"));
  // Another model is not affected; a migration replaces a record and needs no room.
  ASSERT_TRUE(limited.Join(Lid{"prod", 0, 0, 0}, {"tcp://h:1"}, {}).ok());
  JoinAuth holder;
  holder.credential = junk[0].credential;
  ASSERT_TRUE(limited.Join(Lid{"junk", 0, 0, 0}, {"tcp://h:2"}, {}, holder).ok());
  ASSERT_TRUE(limited.Join(Lid{"prod", 0, 0, 1}, {"tcp://h:1"}, {}).ok());
  absl::Status total = limited.Join(Lid{"prod", 0, 0, 2}, {"tcp://h:1"}, {}).status();
  EXPECT_EQ(total.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(total.message()), HasSubstr("5 records, the limit (--max-records"));
  // Room comes back when a record goes.
  Caller c;
  c.credential = junk[1].credential;
  ASSERT_TRUE(limited.Leave(Lid{"junk", 0, 0, 1}, 0, c).ok());
  EXPECT_TRUE(limited.Join(Lid{"prod", 0, 0, 2}, {"tcp://h:1"}, {}).ok());
  // A record too large for the limit.
  absl::Status big =
      limited.Join(Lid{"prod", 0, 0, 3}, {"tcp://h:1"}, {{"blob", std::string(600, 'x')}}).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.message()), HasSubstr("over the limit of 512 (--max-record-bytes"));
  // The defaults keep a snapshot of every record within what clients accept.
  EXPECT_TRUE(
      ValidateTableLimits(kDefaultMaxRecords, kDefaultMaxRecordsPerModel, kDefaultMaxRecordBytes)
          .ok());
  EXPECT_THAT(std::string(ValidateTableLimits(100000, 256, 8192).message()),
              HasSubstr("--max-records 100000 (CONNEX_DIRECTORY_MAX_RECORDS) times"));
}

TEST_F(RegistryTest, RejectsBadRegistrations) {
  EXPECT_EQ(registry_.Join(a_, {"no-scheme"}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::string> many(kMaxAddresses + 1, "tcp://h:1");
  EXPECT_EQ(registry_.Join(a_, many, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // Finding 4 of issue 12: a JOIN with no address was accepted (a record nobody can reach).
  absl::Status none = registry_.Join(a_, {}, {}).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.message()), HasSubstr("addresses: none given"));
  EXPECT_EQ(registry_.size(), 0u);
  EXPECT_EQ(registry_.revision(), 0u);
}

// Per-model watchers find gaps by the model's own revisions: each event names the revision of
// its model's previous event, and a model's snapshot the revision of its latest.
TEST_F(RegistryTest, EventsNameTheirModelsPreviousRevision) {
  Registry r(&clock_, TestOptions());
  ASSERT_TRUE(r.Join(Lid{"a", 1, 0, 0}, {"tcp://h:1"}, {}).ok());  // revision 1
  ASSERT_TRUE(r.Join(Lid{"b", 1, 0, 0}, {"tcp://h:2"}, {}).ok());  // 2
  ASSERT_TRUE(r.Join(Lid{"b", 1, 0, 1}, {"tcp://h:3"}, {}).ok());  // 3
  ASSERT_TRUE(r.Join(Lid{"a", 1, 0, 1}, {"tcp://h:4"}, {}).ok());  // 4
  std::vector<Event> events = r.TakeEvents();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].model_previous, 0u);
  EXPECT_EQ(events[1].model_previous, 0u);
  EXPECT_EQ(events[2].model_previous, 2u);
  EXPECT_EQ(events[3].model_previous, 1u);
  EXPECT_EQ(r.Snap(1, "a").model_revision, 4u);
  EXPECT_EQ(r.Snap(1, "b").model_revision, 3u);
  EXPECT_EQ(r.Snap(1, "c").model_revision, 0u);
  EXPECT_EQ(r.Snap(1).model_revision, 4u);
  // Restored, a model answers the restored revision (no watcher behind it misses a gap).
  Registry again(&clock_, TestOptions());
  again.Restore(r.Export());
  EXPECT_EQ(again.ModelRevision("a"), 4u);
  ASSERT_TRUE(again.Join(Lid{"b", 1, 0, 2}, {"tcp://h:5"}, {}).ok());
  EXPECT_EQ(again.TakeEvents().at(0).model_previous, 4u);
}

TEST_F(RegistryTest, SnapshotFiltersAndCarriesLeases) {
  registry_.Join(a_, {"tcp://h:1"}, {}).IgnoreError();
  registry_.Join(b_, {"tcp://h:2"}, {}).IgnoreError();
  registry_.Join(Lid{"other", 0, 0, 0}, {"tcp://h:3"}, {}).IgnoreError();
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
