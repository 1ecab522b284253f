// EtcdStore and EventDeriver: the key layout and event derivation alone, then the directory's
// rules against a real 3-member etcd cluster (testing/etcd_cluster.h), with a watcher deriving
// the events every operation must produce. Skipped, saying why, where etcd is not installed.
#include "connex/directory/etcd/etcd_store.h"

#include <signal.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/model_watch.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {
namespace {

using testing::EtcdCluster;
using testing::EtcdClusterOptions;
using ::testing::HasSubstr;
using ::testing::StartsWith;

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

// ---- EventDeriver on hand-made watch responses, no etcd ----

WatchEvent Put(const Lid& lid, std::string value, int64_t revision, int64_t version,
               std::optional<KeyValue> prev = std::nullopt) {
  WatchEvent e;
  e.type = WatchEvent::Type::kPut;
  e.kv.key = RecordKey(lid);
  e.kv.value = std::move(value);
  e.kv.mod_revision = revision;
  e.kv.version = version;
  e.prev_kv = std::move(prev);
  return e;
}

WatchEvent Delete(const std::string& key, int64_t revision, std::optional<KeyValue> prev) {
  WatchEvent e;
  e.type = WatchEvent::Type::kDelete;
  e.kv.key = key;
  e.kv.mod_revision = revision;
  e.prev_kv = std::move(prev);
  return e;
}

WatchEvent PutEnd(const Lid& lid, std::string value, int64_t revision) {
  WatchEvent e;
  e.type = WatchEvent::Type::kPut;
  e.kv.key = EndKey(lid);
  e.kv.value = std::move(value);
  e.kv.mod_revision = revision;
  e.kv.version = 1;
  return e;
}

TEST(EventDeriverTest, EachRevisionBecomesTheEventItsTransactionMeans) {
  const Lid a{"demo", 1, 0, 0};
  Record r1{a, 0, {"tcp://127.0.0.1:1"}, {}, 0};
  Record r2{a, 0, {"tcp://127.0.0.1:2"}, {}, 0};
  const std::string v1 = EncodeRecordValue(r1), v2 = EncodeRecordValue(r2);
  auto kv = [&](const std::string& value, int64_t revision) {
    KeyValue k;
    k.key = RecordKey(a);
    k.value = value;
    k.mod_revision = revision;
    return k;
  };
  WatchResponse response;
  response.events = {
      Put(a, v1, 11, 1),                     // JOINED
      Put(a, v2, 12, 2, kv(v1, 11)),         // MIGRATED from 11
      PutEnd(a, "superseded epoch 12", 13),  // forced JOIN: FAILED + JOINED
      Put(a, v1, 13, 3, kv(v2, 12)),
      PutEnd(a, "reported by demo/g2/s0/r0", 14),  // REPORT_FAILED
      Delete(RecordKey(a), 14, kv(v1, 13)),
      Delete(CredentialKey(a), 14, std::nullopt),  // ignored
      Put(a, v2, 15, 1),                           // JOINED again
      Delete(RecordKey(a), 16, kv(v2, 15)),        // lease ran out
      Put(a, v1, 17, 1),
      PutEnd(a, "left", 18),  // LEAVE
      Delete(RecordKey(a), 18, kv(v1, 17)),
  };
  WatchEvent foreign;
  foreign.kv.key = "/elsewhere";
  foreign.kv.mod_revision = 19;
  response.events.push_back(foreign);
  EventDeriver deriver(10);
  std::vector<Event> events = deriver.Apply(response);
  ASSERT_EQ(events.size(), 9u);
  auto expect = [&](size_t i, EventKind kind, uint64_t revision, uint64_t epoch,
                    uint64_t model_previous) {
    SCOPED_TRACE(i);
    EXPECT_EQ(events[i].kind, kind);
    EXPECT_EQ(events[i].revision, revision);
    EXPECT_EQ(events[i].record.epoch, epoch);
    EXPECT_EQ(events[i].record.lid, a);
    EXPECT_EQ(events[i].model_previous, model_previous);
  };
  expect(0, EventKind::kJoined, 11, 11, 10);
  EXPECT_EQ(events[0].record.addresses, r1.addresses);
  expect(1, EventKind::kMigrated, 12, 12, 11);
  EXPECT_EQ(events[1].previous_epoch, 11u);
  EXPECT_EQ(events[1].record.addresses, r2.addresses);
  expect(2, EventKind::kFailed, 13, 12, 12);
  EXPECT_EQ(events[2].reason, "superseded by epoch 13");
  EXPECT_EQ(events[2].record.addresses, r2.addresses);
  expect(3, EventKind::kJoined, 13, 13, 12);
  expect(4, EventKind::kFailed, 14, 13, 13);
  EXPECT_EQ(events[4].reason, "reported by demo/g2/s0/r0");
  expect(5, EventKind::kJoined, 15, 15, 14);
  expect(6, EventKind::kFailed, 16, 15, 15);
  EXPECT_EQ(events[6].reason, "lease-expired");
  expect(7, EventKind::kJoined, 17, 17, 16);
  expect(8, EventKind::kLeft, 18, 17, 17);
  EXPECT_EQ(deriver.skipped(), 1u);
  EXPECT_EQ(deriver.last_revision(), 19u);  // a revision of foreign keys only still counts
  // A watch that resumed before what it delivered repeats nothing.
  EXPECT_TRUE(deriver.Apply(response).empty());
}

// ---- against a real cluster ----

class EtcdStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (EtcdCluster::FindEtcd().empty()) return;
    EtcdClusterOptions options;
    options.dir = ::testing::TempDir();
    auto cluster = EtcdCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    if (EtcdCluster::FindEtcd().empty()) GTEST_SKIP() << EtcdCluster::kSkipMessage;
    ASSERT_NE(cluster_, nullptr);
    EtcdClientOptions options;
    options.address = cluster_->address();
    auto client = EtcdClient::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    // Every test its own model, so that one cluster serves the suite.
    model_ = StrCat("m-", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    model_.resize(std::min<size_t>(model_.size(), Lid::kMaxModelLength));
  }

  std::unique_ptr<EtcdStore> Open(EtcdStoreOptions options = {}) {
    if (options.admin_token.empty()) options.admin_token = "admin-secret";
    auto store = EtcdStore::Open(client_.get(), options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  Lid L(uint32_t group, uint32_t replica) const { return Lid{model_, group, 0, replica}; }

  // A watcher of the model from its snapshot on, deriving events.
  struct Watcher {
    std::unique_ptr<EtcdWatch> watch;
    std::unique_ptr<EventDeriver> deriver;
    std::vector<Event> events;
    // Waits until `count` events were derived in all (20 s at most), and returns them.
    const std::vector<Event>& Await(size_t count) {
      absl::Time deadline = absl::Now() + absl::Seconds(20);
      while (events.size() < count && absl::Now() < deadline) {
        absl::StatusOr<WatchResponse> response = watch->Next(absl::Milliseconds(200));
        if (absl::IsDeadlineExceeded(response.status())) continue;
        EXPECT_TRUE(response.ok()) << response.status();
        if (!response.ok()) break;
        for (Event& e : deriver->Apply(*response)) events.push_back(std::move(e));
      }
      return events;
    }
  };
  Watcher Watch(EtcdStore& store) {
    absl::StatusOr<Snapshot> snapshot = store.Snap(model_);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status();
    WatchOptions options;
    options.range_end = PrefixEnd(ModelPrefix(model_));
    options.start_revision = static_cast<int64_t>(snapshot->revision) + 1;
    options.prev_kv = true;
    Watcher watcher;
    watcher.watch = client_->Watch(ModelPrefix(model_), options);
    watcher.deriver = std::make_unique<EventDeriver>(snapshot->revision);
    return watcher;
  }

  static std::string Kinds(const std::vector<Event>& events) {
    std::string out;
    for (const Event& e : events) {
      out += StrCat(out.empty() ? "" : " ", EventKindName(e.kind), ":", e.record.lid.ToString(),
                    "@", e.record.epoch, e.reason.empty() ? "" : StrCat("(", e.reason, ")"));
    }
    return out;
  }

  static EtcdCluster* cluster_;
  std::unique_ptr<EtcdClient> client_;
  std::string model_;
};

EtcdCluster* EtcdStoreTest::cluster_ = nullptr;

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

// A store whose lease etcd lost (revoked here; an outage longer than the TTL does the same) sees
// its LIDs FAILED lease-expired, learns that the lease is gone, and joins again under a new epoch.
TEST_F(EtcdStoreTest, AStoreWhoseLeaseIsLostJoinsAgainUnderANewEpoch) {
  EtcdStoreOptions options;
  options.lease_ttl_ms = 2000;
  auto watcher_store = Open();
  ASSERT_NE(watcher_store, nullptr);
  Watcher watcher = Watch(*watcher_store);
  auto store = Open(options);
  ASSERT_NE(store, nullptr);
  auto joined = store->Join(L(1, 0), {"tcp://127.0.0.1:1"}, {});
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(watcher.Await(1).size(), 1u);
  const int64_t ttl_ms = store->lease_ttl_ms();
  // Its keepalive outlives several TTLs.
  absl::SleepFor(absl::Milliseconds(2 * ttl_ms));  // a span of time the lease must survive
  EXPECT_TRUE(store->Confirm(L(1, 0), joined->epoch).ok());
  EXPECT_EQ(watcher.events.size(), 1u) << Kinds(watcher.events);

  // The lease is revoked behind the store's back (as when etcd lost it in a long outage).
  const auto lost = std::chrono::steady_clock::now();
  ASSERT_TRUE(client_->LeaseRevoke(store->lease_id()).ok());
  const std::vector<Event>& events = watcher.Await(2);
  ASSERT_EQ(events.size(), 2u) << Kinds(events);
  EXPECT_EQ(events[1].kind, EventKind::kFailed);
  EXPECT_EQ(events[1].reason, "lease-expired");
  std::cout << "revoked lease to FAILED seen by a watcher: "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - lost)
                   .count()
            << " ms (TTL " << ttl_ms << " ms)\n";
  // The store learns its lease is gone, takes a new one, and joins again under a new epoch.
  absl::Time deadline = absl::Now() + absl::Seconds(3 * ttl_ms / 1000 + 5);
  while (store->lease_status().ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(store->lease_status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Join(L(1, 0), {"tcp://127.0.0.1:1"}, {}).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(store->RenewLease().ok());
  auto again = store->Join(L(1, 0), {"tcp://127.0.0.1:1"}, {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->epoch, joined->epoch);
  ASSERT_EQ(watcher.Await(3).size(), 3u) << Kinds(watcher.events);
  EXPECT_EQ(watcher.events[2].kind, EventKind::kJoined);
}

// A holder that stops renewing (a killed process: etcd sees only its renewals stop) is FAILED
// lease-expired by etcd alone, within its TTL and etcd's expiry sweep (printed, not asserted).
TEST_F(EtcdStoreTest, AHolderThatStopsRenewingIsFailedWhenItsLeaseRunsOut) {
  auto watcher_store = Open();
  ASSERT_NE(watcher_store, nullptr);
  Watcher watcher = Watch(*watcher_store);
  EtcdStoreOptions options;
  options.lease_ttl_ms = 2000;
  auto store = Open(options);
  ASSERT_NE(store, nullptr);
  auto joined = store->Join(L(1, 0), {"tcp://127.0.0.1:1"}, {});
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(watcher.Await(1).size(), 1u);
  const auto killed = std::chrono::steady_clock::now();
  store->StopRenewingForTest();
  const std::vector<Event>& events = watcher.Await(2);
  ASSERT_EQ(events.size(), 2u) << Kinds(events);
  EXPECT_EQ(events[1].kind, EventKind::kFailed);
  EXPECT_EQ(events[1].reason, "lease-expired");
  EXPECT_EQ(events[1].record.epoch, joined->epoch);
  std::cout << "holder stopped renewing to FAILED seen by a watcher: "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - killed)
                   .count()
            << " ms (TTL " << store->lease_ttl_ms() << " ms)\n";
}

// The must-show of issue 13: a compaction past a watcher's revision is survived with a correct
// view. The watcher's member is frozen (SIGSTOP; the watcher's client does not probe it) while the
// model changes and the history is compacted past the changes; then it is killed, so the watch
// resumes on another member, finds its revision compacted, and catches up from a fresh snapshot,
// reporting what changed as events.
TEST_F(EtcdStoreTest, AWatcherWhoseHistoryWasCompactedCatchesUpFromASnapshot) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto a = store->Join(L(1, 0), {"tcp://127.0.0.1:1"}, {});
  auto b = store->Join(L(1, 1), {"tcp://127.0.0.1:2"}, {});
  ASSERT_TRUE(a.ok() && b.ok());
  Mutex mu;
  std::vector<Event> events;
  // A watcher that stays on its member however long it is silent (the probe would otherwise
  // move it on after ~3 s, maybe before the compaction).
  EtcdClientOptions patient;
  patient.address = cluster_->address();
  patient.watch_probe_interval = absl::Seconds(600);
  patient.keepalive_time = absl::Seconds(600);
  auto watcher_client = EtcdClient::Connect(patient);
  ASSERT_TRUE(watcher_client.ok()) << watcher_client.status();
  auto watch = EtcdModelWatch::Start(watcher_client->get(), model_, [&](const Event& e) {
    MutexLock lock(&mu);
    events.push_back(e);
  });
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_EQ((*watch)->View().size(), 2u);
  // The watch streams from a member once it has asked for its first events.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*watch)->member().empty() && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(20));
  const int frozen = cluster_->IndexOf((*watch)->member());
  ASSERT_GE(frozen, 0) << (*watch)->member();
  cluster_->Signal(frozen, SIGSTOP);
  // The member comes back for the next tests, whatever happens here.
  struct Revive {
    EtcdCluster* cluster;
    int index;
    ~Revive() {
      if (cluster->running(index)) {
        cluster->Signal(index, SIGCONT);
      } else {
        EXPECT_TRUE(cluster->Restart(index).ok());
      }
    }
  } revive{cluster_, frozen};

  // Meanwhile: a leaves, b migrates, c joins; then the history is compacted past all of it.
  Caller holder_a;
  holder_a.credential = a->credential;
  ASSERT_TRUE(store->Leave(L(1, 0), a->epoch, holder_a).ok());
  JoinAuth holder_b;
  holder_b.credential = b->credential;
  auto moved = store->Join(L(1, 1), {"tcp://127.0.0.1:3"}, {}, holder_b);
  ASSERT_TRUE(moved.ok()) << moved.status();
  auto c = store->Join(L(1, 2), {"tcp://127.0.0.1:4"}, {});
  ASSERT_TRUE(c.ok()) << c.status();
  auto now = client_->Range(RecordKey(L(1, 2)));
  ASSERT_TRUE(now.ok()) << now.status();
  ASSERT_TRUE(client_->Compact(now->revision).ok());
  // Its connections reset, the watch resumes on another member from a compacted revision.
  cluster_->Kill(frozen);

  deadline = absl::Now() + absl::Seconds(30);
  auto caught_up = [&] {
    std::vector<Record> view = (*watch)->View();
    return view.size() == 2 && view[0].lid == L(1, 1) && view[0].epoch == moved->epoch &&
           view[1].lid == L(1, 2) && view[1].epoch == c->epoch;
  };
  while (!caught_up() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(caught_up()) << "the watcher's view did not catch up";
  EXPECT_GE((*watch)->resnapshots(), 1u);
  EXPECT_GE((*watch)->revision(), static_cast<uint64_t>(now->revision));
  MutexLock lock(&mu);
  std::string seen = Kinds(events);
  // What changed, as the events a gap synthesises: a and b's old epoch gone, b's new epoch and
  // c joined.
  EXPECT_THAT(seen, HasSubstr(StrCat("FAILED:", L(1, 0).ToString(), "@", a->epoch)));
  EXPECT_THAT(seen, HasSubstr(StrCat("FAILED:", L(1, 1).ToString(), "@", b->epoch)));
  EXPECT_THAT(seen, HasSubstr(StrCat("JOINED:", L(1, 1).ToString(), "@", moved->epoch)));
  EXPECT_THAT(seen, HasSubstr(StrCat("JOINED:", L(1, 2).ToString(), "@", c->epoch)));
}

}  // namespace
}  // namespace connex::directory::etcd
