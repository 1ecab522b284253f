// EtcdStore: the key layout and record values alone, then the directory's rules against a real
// 3-member etcd cluster (testing/etcd_cluster.h) — JOIN, migration, retries, LEAVE, hijacks and the
// operator's takeover, reports and drains, limits — with a watcher deriving the events every
// operation must produce. Event derivation alone is event_deriver_test.cc; a lost lease, a holder
// that stops renewing and a compacted watcher etcd_store_recovery_test.cc. Skipped, saying why,
// where etcd is not installed.
#include "connex/directory/etcd/etcd_store.h"

#include <string>
#include <vector>

#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_store_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {
namespace {

using ::testing::HasSubstr;

// ---- keys and values, no etcd ----

TEST(EtcdKeysTest, EveryKeyParsesBackToItsLidAndKind) {
  const Lid lid{"llama-7b", 3, 1, 12};
  EXPECT_EQ(RecordKey(lid), "/connex/v1/m/llama-7b/lid/g3/s1/r12");
  EXPECT_EQ(CredentialKey(lid), "/connex/v1/m/llama-7b/cred/g3/s1/r12");
  EXPECT_EQ(EndKey(lid), "/connex/v1/m/llama-7b/end/g3/s1/r12");
  for (auto [key, kind] : {std::pair{RecordKey(lid), ParsedKey::Kind::kRecord},
                           std::pair{CredentialKey(lid), ParsedKey::Kind::kCredential},
                           std::pair{EndKey(lid), ParsedKey::Kind::kEnd}}) {
    absl::StatusOr<ParsedKey> parsed = ParseKey(key);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->lid, lid);
    EXPECT_EQ(parsed->kind, kind);
  }
}

TEST(EtcdKeysTest, ForeignKeysAreRefusedNamingWhatIsWrong) {
  for (auto [key, why] : std::vector<std::pair<std::string, std::string>>{
           {"/other/x", "not under /connex/v1/m/"},
           {"/connex/v1/m/demo", "no kind after the model"},
           {"/connex/v1/m/demo/lid", "no LID after the kind"},
           {"/connex/v1/m/demo/what/g1/s0/r0", "unknown kind 'what'"},
           {"/connex/v1/m/demo/lid/g1/sX/r0", "demo/g1/sX/r0"}}) {
    absl::StatusOr<ParsedKey> parsed = ParseKey(key);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(why)) << key;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(key)) << key;
  }
}

TEST(EtcdKeysTest, RecordValuesRoundTripAndCorruptOnesNameTheirLid) {
  Record record;
  record.lid = Lid{"demo", 1, 0, 2};
  record.addresses = {"tcp://127.0.0.1:5000", "shm://host/seg"};
  record.metadata = {{"http", "127.0.0.1:8000"}};
  absl::StatusOr<Record> back = DecodeRecordValue(record.lid, EncodeRecordValue(record));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, record);
  absl::StatusOr<Record> corrupt = DecodeRecordValue(record.lid, "not msgpack");
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr("demo/g1/s0/r2"));
}

TEST(EtcdKeysTest, CredentialsAreStoredAsTheirSha256) {
  // FIPS 180-2's example.
  EXPECT_EQ(CredentialDigest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// ---- against a real cluster ----

TEST_F(EtcdStoreTest, JoinMigrateRetryAndLeaveAreTheEventsAWatcherDerives) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Watcher watcher = Watch(*store);
  const Lid a = L(1, 0);
  auto joined = store->Join(a, {"tcp://127.0.0.1:1"}, {{"role", "stage"}});
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_TRUE(joined->changed);
  // The epoch is etcd's revision of the JOIN, and a snapshot shows the record under it.
  auto snapshot = store->Snap(model_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->records.size(), 1u);
  EXPECT_EQ(snapshot->records[0].epoch, joined->epoch);
  EXPECT_EQ(snapshot->records[0].metadata.at("role"), "stage");
  EXPECT_GE(snapshot->revision, joined->epoch);
  EXPECT_TRUE(store->Confirm(a, joined->epoch).ok());

  // The holder's retry of the same JOIN changes nothing.
  JoinAuth holder;
  holder.credential = joined->credential;
  auto retry = store->Join(a, {"tcp://127.0.0.1:1"}, {{"role", "stage"}}, holder);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->changed);
  EXPECT_EQ(retry->epoch, joined->epoch);
  EXPECT_EQ(retry->credential, joined->credential);

  // A migration: a new epoch and credential; the old epoch is over.
  auto moved = store->Join(a, {"tcp://127.0.0.1:2"}, {{"role", "stage"}}, holder);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_GT(moved->epoch, joined->epoch);
  EXPECT_NE(moved->credential, joined->credential);
  absl::Status old = store->Confirm(a, joined->epoch);
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(old.message()), HasSubstr(StrCat("superseded by ", moved->epoch)));

  // The old credential no longer leaves; the new one does.
  Caller stale;
  stale.credential = joined->credential;
  EXPECT_EQ(store->Leave(a, 0, stale).code(), absl::StatusCode::kPermissionDenied);
  Caller caller;
  caller.credential = moved->credential;
  ASSERT_TRUE(store->Leave(a, moved->epoch, caller).ok());
  EXPECT_EQ(store->Leave(a, 0, caller).code(), absl::StatusCode::kNotFound);
  absl::Status after_leave = store->Confirm(a, moved->epoch);
  EXPECT_EQ(after_leave.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(after_leave.message()), HasSubstr("it left"));

  const std::vector<Event>& events = watcher.Await(3);
  ASSERT_EQ(events.size(), 3u) << Kinds(events);
  EXPECT_EQ(events[0].kind, EventKind::kJoined);
  EXPECT_EQ(events[0].record.epoch, joined->epoch);
  EXPECT_EQ(events[1].kind, EventKind::kMigrated);
  EXPECT_EQ(events[1].record.epoch, moved->epoch);
  EXPECT_EQ(events[1].previous_epoch, joined->epoch);
  EXPECT_EQ(events[1].record.addresses, std::vector<std::string>{"tcp://127.0.0.1:2"});
  EXPECT_EQ(events[2].kind, EventKind::kLeft) << Kinds(events);
  EXPECT_EQ(events[2].record.epoch, moved->epoch);
}

TEST_F(EtcdStoreTest, AHijackIsRefusedAndAForcedTakeoverFencesTheHolder) {
  auto holder = Open();
  auto stranger = Open();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(stranger, nullptr);
  Watcher watcher = Watch(*holder);
  const Lid a = L(1, 0);
  auto joined = holder->Join(a, {"tcp://127.0.0.1:1"}, {});
  ASSERT_TRUE(joined.ok()) << joined.status();

  auto hijack = stranger->Join(a, {"tcp://6.6.6.6:666"}, {});
  EXPECT_EQ(hijack.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(hijack.status().message()),
              HasSubstr(StrCat("held by epoch ", joined->epoch)));
  EXPECT_THAT(std::string(hijack.status().message()), HasSubstr("s of its lease left"));
  JoinAuth exclusive;
  exclusive.exclusive = true;
  EXPECT_EQ(stranger->Join(a, {"tcp://6.6.6.6:666"}, {}, exclusive).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A forged credential is no credential.
  JoinAuth forged;
  forged.credential = "0123456789abcdef0123456789abcdef";
  EXPECT_EQ(stranger->Join(a, {"tcp://6.6.6.6:666"}, {}, forged).status().code(),
            absl::StatusCode::kAlreadyExists);
  JoinAuth force;
  force.force = true;
  force.admin_token = "wrong";
  EXPECT_EQ(stranger->Join(a, {"tcp://6.6.6.6:666"}, {}, force).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(holder->Confirm(a, joined->epoch).ok());

  force.admin_token = "admin-secret";
  auto taken = stranger->Join(a, {"tcp://127.0.0.1:9"}, {}, force);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_GT(taken->epoch, joined->epoch);
  absl::Status fenced = holder->Confirm(a, joined->epoch);
  EXPECT_EQ(fenced.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fenced.message()), HasSubstr("superseded"));
  // The fenced holder's credential moves nothing any more.
  JoinAuth old;
  old.credential = joined->credential;
  EXPECT_EQ(holder->Join(a, {"tcp://127.0.0.1:1"}, {}, old).status().code(),
            absl::StatusCode::kAlreadyExists);

  const std::vector<Event>& events = watcher.Await(3);
  ASSERT_EQ(events.size(), 3u) << Kinds(events);
  EXPECT_EQ(events[0].kind, EventKind::kJoined);
  EXPECT_EQ(events[1].kind, EventKind::kFailed);
  EXPECT_EQ(events[1].record.epoch, joined->epoch);
  EXPECT_EQ(events[1].reason, StrCat("superseded by epoch ", taken->epoch));
  EXPECT_EQ(events[2].kind, EventKind::kJoined);
  EXPECT_EQ(events[2].record.epoch, taken->epoch);
  EXPECT_EQ(events[2].record.addresses, std::vector<std::string>{"tcp://127.0.0.1:9"});
}

TEST_F(EtcdStoreTest, OnlyALiveMemberOrTheOperatorReportsOrDrains) {
  auto holder = Open();
  auto other = Open();
  ASSERT_NE(holder, nullptr);
  ASSERT_NE(other, nullptr);
  const Lid a = L(1, 0);
  auto joined = holder->Join(a, {"tcp://127.0.0.1:1"}, {});
  ASSERT_TRUE(joined.ok()) << joined.status();
  Watcher watcher = Watch(*holder);

  // A stranger's LEAVE and REPORT_FAILED are refused.
  Caller stranger;
  stranger.name = "connexctl";
  EXPECT_EQ(other->Leave(a, 0, stranger).code(), absl::StatusCode::kPermissionDenied);
  auto report = other->ReportFailed(a, 0, stranger);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("holds no LID"));
  // Claiming a LID it does not hold (with a made-up credential) does not help.
  Caller impostor;
  impostor.member = L(2, 0);
  impostor.member_credential = "0123456789abcdef0123456789abcdef";
  report = other->ReportFailed(a, 0, impostor);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("not a live LID"));
  // Nor does a live LID of another model.
  auto elsewhere = other->Join(Lid{model_ + "-x", 2, 0, 0}, {"tcp://127.0.0.1:3"}, {});
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  Caller outsider;
  outsider.member = Lid{model_ + "-x", 2, 0, 0};
  outsider.member_credential = elsewhere->credential;
  EXPECT_EQ(other->ReportFailed(a, 0, outsider).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(holder->Confirm(a, joined->epoch).ok());

  // A live member of the model reports: an older epoch is nothing to do, the current one goes.
  auto member = other->Join(L(2, 0), {"tcp://127.0.0.1:2"}, {});
  ASSERT_TRUE(member.ok()) << member.status();
  Caller reporter;
  reporter.member = L(2, 0);
  reporter.member_credential = member->credential;
  reporter.name = "stage 2";
  auto stale = other->ReportFailed(a, joined->epoch - 1, reporter);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_FALSE(*stale);
  auto evicted = other->ReportFailed(a, joined->epoch, reporter);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_TRUE(*evicted);
  EXPECT_EQ(other->ReportFailed(a, 0, reporter).status().code(), absl::StatusCode::kNotFound);
  absl::Status evicted_status = holder->Confirm(a, joined->epoch);
  EXPECT_EQ(evicted_status.code(), absl::StatusCode::kNotFound);  // evicted: join again
  EXPECT_THAT(std::string(evicted_status.message()), HasSubstr("reported by"));

  // The operator drains the member with the admin token.
  Caller op;
  op.admin_token = "wrong";
  EXPECT_EQ(holder->Leave(L(2, 0), 0, op).code(), absl::StatusCode::kPermissionDenied);
  op.admin_token = "admin-secret";
  ASSERT_TRUE(holder->Leave(L(2, 0), 0, op).ok());

  const std::vector<Event>& events = watcher.Await(3);
  ASSERT_EQ(events.size(), 3u) << Kinds(events);
  EXPECT_EQ(events[0].kind, EventKind::kJoined);  // the member
  EXPECT_EQ(events[1].kind, EventKind::kFailed);
  EXPECT_EQ(events[1].record.lid, a);
  EXPECT_EQ(events[1].reason, StrCat("reported by ", L(2, 0).ToString(), " (stage 2)"));
  EXPECT_EQ(events[2].kind, EventKind::kLeft);
  EXPECT_EQ(events[2].record.lid, L(2, 0));
}

TEST_F(EtcdStoreTest, LimitsAreRefusedNamingThem) {
  EtcdStoreOptions options;
  options.max_records_per_model = 2;
  options.max_record_bytes = 512;
  auto store = Open(options);
  ASSERT_NE(store, nullptr);
  auto a = store->Join(L(1, 0), {"tcp://127.0.0.1:1"}, {});
  auto b = store->Join(L(1, 1), {"tcp://127.0.0.1:2"}, {});
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = store->Join(L(1, 2), {"tcp://127.0.0.1:3"}, {});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("CONNEX_DIRECTORY_MAX_RECORDS_PER_MODEL"));
  // A full model still lets its holders migrate.
  JoinAuth holder;
  holder.credential = a->credential;
  EXPECT_TRUE(store->Join(L(1, 0), {"tcp://127.0.0.1:4"}, {}, holder).ok());
  // Every model together: a limit of its own.
  EtcdStoreOptions tight = options;
  tight.max_records = 1;  // the cluster holds this suite's earlier records, and a and b
  auto small = Open(tight);
  ASSERT_NE(small, nullptr);
  auto other = small->Join(Lid{model_ + "-other", 1, 0, 0}, {"tcp://127.0.0.1:6"}, {});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("CONNEX_DIRECTORY_MAX_RECORDS)"));
  auto big = store->Join(Lid{model_ + "-big", 1, 0, 0}, {"tcp://127.0.0.1:5"},
                         {{"blob", std::string(1000, 'x')}});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("over the limit of 512"));
  auto empty = store->Join(Lid{model_ + "-big", 1, 0, 0}, {}, {});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace connex::directory::etcd
