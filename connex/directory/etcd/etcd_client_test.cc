// EtcdClient against a real 3-member etcd cluster (testing/etcd_cluster.h), killed with SIGKILL
// where a test says so. Skipped, saying why, where etcd is not installed.
#include "connex/directory/etcd/etcd_client.h"

#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {
namespace {

using ::testing::ElementsAre;
using testing::EtcdCluster;
using testing::EtcdClusterOptions;
using ::testing::HasSubstr;
using ::testing::Not;

RangeOptions Prefix(std::string_view prefix) {
  RangeOptions options;
  options.range_end = PrefixEnd(prefix);
  return options;
}

// Creates `key` and returns the revision that wrote it — once, even when the client retried a
// write that an attempt it gave up on had applied (EtcdClient's contract: a write that timed out
// on one member may be done; retry-safe writes compare on their own value).
absl::StatusOr<int64_t> CreateOnce(EtcdClient& client, const std::string& key,
                                   const std::string& value) {
  CONNEX_ASSIGN_OR_RETURN(
      TxnResult txn,
      client.Transact(Txn{{Compare::Absent(key)}, {TxnOp::Put(key, value)}, {TxnOp::Get(key)}}));
  if (txn.succeeded) return txn.revision;
  if (txn.results.empty() || txn.results[0].range.kvs.empty() ||
      txn.results[0].range.kvs[0].value != value) {
    return absl::AlreadyExistsError(StrCat(key, " exists with another value"));
  }
  return txn.results[0].range.kvs[0].mod_revision;
}

std::string Describe(const std::vector<WatchEvent>& events) {
  std::string out;
  for (const WatchEvent& e : events) {
    out += (e.type == WatchEvent::Type::kPut ? " PUT " : " DELETE ") + e.kv.key + "@" +
           std::to_string(e.kv.mod_revision);
  }
  return out;
}

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdCluster::FindEtcd().empty()) GTEST_SKIP() << EtcdCluster::kSkipMessage;
    EtcdClusterOptions options;
    options.dir = ::testing::TempDir();
    auto cluster = EtcdCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  std::unique_ptr<EtcdClient> Connect(EtcdClientOptions options = {}) {
    if (options.address.empty()) options.address = cluster_->address();
    auto client = EtcdClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Responses of `watch` until `count` events have come (or 20 s passed: then fewer).
  static std::vector<WatchEvent> Events(EtcdWatch& watch, size_t count) {
    std::vector<WatchEvent> events;
    absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (events.size() < count && absl::Now() < deadline) {
      absl::StatusOr<WatchResponse> response = watch.Next(absl::Seconds(1));
      if (absl::IsDeadlineExceeded(response.status())) continue;
      EXPECT_TRUE(response.ok()) << response.status();
      if (!response.ok()) break;
      for (WatchEvent& event : response->events) events.push_back(std::move(event));
    }
    return events;
  }

  std::unique_ptr<EtcdCluster> cluster_;
};

TEST(EtcdClientOptionsTest, ConnectRefusesBadOptionsSayingWhichOne) {
  EtcdClientOptions options;
  options.address = "etcd://127.0.0.1:2379,";
  auto client = EtcdClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("an empty member"));

  options.address = "etcd://127.0.0.1:2379";
  options.tls.ca_file = "/nonexistent/ca.pem";
  client = EtcdClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("'/nonexistent/ca.pem'"));

  options.tls = {};
  options.tls.cert_file = "/some/cert.pem";
  client = EtcdClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("without a CA"));

  options.tls = {};
  options.password = "secret";
  client = EtcdClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("a password without a user"));

  options.password.clear();
  options.attempt_timeout = absl::Seconds(10);
  client = EtcdClient::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EtcdClientOptionsTest, PrefixEndCoversExactlyThePrefix) {
  EXPECT_EQ(PrefixEnd("connex/m/"), "connex/m0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixEnd(""), std::string(1, '\0'));
}

TEST_F(EtcdClientTest, PutRangeDeleteAndCompareAndSwap) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<PutResult> put = client->Put("t/a", "1");
  ASSERT_TRUE(put.ok()) << put.status();
  const int64_t r1 = put->revision;
  EXPECT_GT(r1, 0);

  absl::StatusOr<RangeResult> range = client->Range("t/a");
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 1u);
  EXPECT_EQ(range->kvs[0].value, "1");
  EXPECT_EQ(range->kvs[0].create_revision, r1);
  EXPECT_EQ(range->kvs[0].mod_revision, r1);
  EXPECT_EQ(range->kvs[0].version, 1);
  EXPECT_EQ(range->revision, r1);

  // Create-if-absent: the first one wins, the second sees the holder's value.
  Txn create{{Compare::Absent("t/b")}, {TxnOp::Put("t/b", "first")}, {TxnOp::Get("t/b")}};
  absl::StatusOr<TxnResult> txn = client->Transact(create);
  ASSERT_TRUE(txn.ok()) << txn.status();
  EXPECT_TRUE(txn->succeeded);
  ASSERT_EQ(txn->results.size(), 1u);
  EXPECT_EQ(txn->results[0].kind, TxnOp::Kind::kPut);
  const int64_t rb = txn->revision;
  create.success = {TxnOp::Put("t/b", "second")};
  txn = client->Transact(create);
  ASSERT_TRUE(txn.ok()) << txn.status();
  EXPECT_FALSE(txn->succeeded);
  ASSERT_EQ(txn->results.size(), 1u);
  ASSERT_EQ(txn->results[0].kind, TxnOp::Kind::kRange);
  ASSERT_EQ(txn->results[0].range.kvs.size(), 1u);
  EXPECT_EQ(txn->results[0].range.kvs[0].value, "first");
  EXPECT_EQ(txn->results[0].range.kvs[0].create_revision, rb);

  // Compare-and-swap on mod_revision: a stale revision loses.
  txn = client->Transact(
      {{Compare::ModRevision("t/a", Compare::Result::kEqual, r1)}, {TxnOp::Put("t/a", "2")}, {}});
  ASSERT_TRUE(txn.ok()) << txn.status();
  EXPECT_TRUE(txn->succeeded);
  txn = client->Transact(
      {{Compare::ModRevision("t/a", Compare::Result::kEqual, r1)}, {TxnOp::Put("t/a", "3")}, {}});
  ASSERT_TRUE(txn.ok()) << txn.status();
  EXPECT_FALSE(txn->succeeded);
  // On value, version and create_revision.
  txn = client->Transact({{Compare::Value("t/a", Compare::Result::kEqual, "2"),
                           Compare::Version("t/a", Compare::Result::kEqual, 2),
                           Compare::CreateRevision("t/a", Compare::Result::kEqual, r1)},
                          {TxnOp::Put("t/a", "4")},
                          {}});
  ASSERT_TRUE(txn.ok()) << txn.status();
  EXPECT_TRUE(txn->succeeded);
  txn = client->Transact(
      {{Compare::Value("t/a", Compare::Result::kEqual, "2")}, {TxnOp::Put("t/a", "5")}, {}});
  ASSERT_TRUE(txn.ok()) << txn.status();
  EXPECT_FALSE(txn->succeeded);

  range = client->Range("t/", Prefix("t/"));
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0].key, "t/a");
  EXPECT_EQ(range->kvs[0].value, "4");
  EXPECT_EQ(range->kvs[0].version, 3);
  EXPECT_EQ(range->kvs[1].key, "t/b");

  absl::StatusOr<DeleteResult> del = client->DeleteRange("t/a", "", /*prev_kv=*/true);
  ASSERT_TRUE(del.ok()) << del.status();
  EXPECT_EQ(del->deleted, 1);
  ASSERT_EQ(del->prev_kvs.size(), 1u);
  EXPECT_EQ(del->prev_kvs[0].value, "4");
  range = client->Range("t/a");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_TRUE(range->kvs.empty());
  EXPECT_EQ(range->count, 0);
  // A deleted key is absent again.
  txn = client->Transact({{Compare::Absent("t/a")}, {TxnOp::Put("t/a", "again")}, {}});
  ASSERT_TRUE(txn.ok()) << txn.status();
  EXPECT_TRUE(txn->succeeded);
}

TEST_F(EtcdClientTest, ThreadsShareOneClientAndAWatchSeesEveryWriteOnceInOrder) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<RangeResult> now = client->Range("p/");
  ASSERT_TRUE(now.ok()) << now.status();
  WatchOptions from;
  from.range_end = PrefixEnd("p/");
  from.start_revision = now->revision + 1;
  std::unique_ptr<EtcdWatch> watch = client->Watch("p/", from);

  constexpr int kThreads = 4;
  constexpr int kWrites = 25;
  // 64 KiB values: the range below is 6.4 MiB, past gRPC's default 4 MiB message limit.
  const std::string value(64 * 1024, 'v');
  std::vector<std::thread> threads;
  std::vector<absl::Status> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWrites && failures[t].ok(); ++i) {
        failures[t] = client->Put(StrCat("p/", t, "/", i), value).status();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& failure : failures) ASSERT_TRUE(failure.ok()) << failure;

  std::vector<WatchEvent> events = Events(*watch, kThreads * kWrites);
  ASSERT_EQ(events.size(), static_cast<size_t>(kThreads * kWrites));
  for (size_t i = 1; i < events.size(); ++i) {
    ASSERT_EQ(events[i].kv.mod_revision, events[i - 1].kv.mod_revision + 1) << i;
  }
  absl::StatusOr<RangeResult> range = client->Range("p/", Prefix("p/"));
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->kvs.size(), static_cast<size_t>(kThreads * kWrites));
  EXPECT_EQ(range->revision, events.back().kv.mod_revision);
}

TEST_F(EtcdClientTest, AKeptAliveLeaseOutlivesThreeTtlsAndARevokedOrExpiredOneDeletesItsKeys) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<LeaseGrantResult> lease = client->LeaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client->Put("l/kept", "x", lease->id).ok());
  std::unique_ptr<EtcdKeepAlive> keepalive = client->KeepAlive(lease->id, absl::Milliseconds(500));

  // Observed for three TTLs: the key is there at every look.
  const absl::Time until = absl::Now() + absl::Seconds(3 * lease->ttl_seconds);
  int looks = 0;
  while (absl::Now() < until) {
    absl::StatusOr<RangeResult> range = client->Range("l/kept");
    ASSERT_TRUE(range.ok()) << range.status();
    ASSERT_EQ(range->kvs.size(), 1u) << "after " << looks << " looks";
    EXPECT_EQ(range->kvs[0].lease, lease->id);
    ASSERT_TRUE(keepalive->status().ok()) << keepalive->status();
    ++looks;
    absl::SleepFor(absl::Milliseconds(200));  // the pace of the looks, not a synchronisation
  }
  EXPECT_GT(keepalive->renewals(), 0);
  EXPECT_GT(keepalive->last_ttl_seconds(), 0);
  absl::StatusOr<LeaseTimeToLiveResult> ttl = client->LeaseTimeToLive(lease->id, /*keys=*/true);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GT(ttl->ttl_seconds, 0);
  EXPECT_THAT(ttl->keys, ElementsAre("l/kept"));

  // Revoked: its key goes with it, at once.
  keepalive.reset();
  ASSERT_TRUE(client->LeaseRevoke(lease->id).ok());
  absl::StatusOr<RangeResult> range = client->Range("l/kept");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_TRUE(range->kvs.empty());
  ttl = client->LeaseTimeToLive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_EQ(ttl->ttl_seconds, -1);
  absl::Status again = client->LeaseRevoke(lease->id);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr("LeaseRevoke on 127.0.0.1:"));

  // Not kept alive: it expires and takes its key; a keepalive of it then says NotFound.
  absl::StatusOr<LeaseGrantResult> lapsed = client->LeaseGrant(2);
  ASSERT_TRUE(lapsed.ok()) << lapsed.status();
  ASSERT_TRUE(client->Put("l/lapsed", "y", lapsed->id).ok());
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<RangeResult> r = client->Range("l/lapsed");
        return r.ok() && r->kvs.empty();
      },
      20000, 50));
  keepalive = client->KeepAlive(lapsed->id, absl::Milliseconds(100));
  EXPECT_TRUE(WaitUntil([&] { return absl::IsNotFound(keepalive->status()); }, 10000));
  EXPECT_THAT(std::string(keepalive->status().message()), HasSubstr("grant a new one"));
}

TEST_F(EtcdClientTest, AWatchSeesEventsInOrderAndResumesOnAnotherMemberAfterItsMemberIsKilled) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<PutResult> a = client->Put("w/a", "1");
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<PutResult> b = client->Put("w/b", "2");
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<DeleteResult> d = client->DeleteRange("w/a");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(client->Put("other", "not watched").ok());

  WatchOptions options;
  options.range_end = PrefixEnd("w/");
  options.start_revision = a->revision;
  options.prev_kv = true;
  std::unique_ptr<EtcdWatch> watch = client->Watch("w/", options);
  std::vector<WatchEvent> events = Events(*watch, 3);
  ASSERT_EQ(events.size(), 3u) << Describe(events);
  EXPECT_EQ(events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(events[0].kv.key, "w/a");
  EXPECT_EQ(events[0].kv.mod_revision, a->revision);
  EXPECT_EQ(events[1].kv.key, "w/b");
  EXPECT_EQ(events[1].kv.value, "2");
  EXPECT_EQ(events[1].kv.mod_revision, b->revision);
  EXPECT_EQ(events[2].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(events[2].kv.key, "w/a");
  EXPECT_EQ(events[2].kv.mod_revision, d->revision);
  ASSERT_TRUE(events[2].prev_kv.has_value());
  EXPECT_EQ(events[2].prev_kv->value, "1");

  // kill -9 of the member the watch streams from; the writes after it (on whichever member the
  // client moves to) reach the watch once, in order, from another member.
  const std::string streaming = watch->member();
  const int victim = cluster_->IndexOf(streaming);
  ASSERT_GE(victim, 0) << "the watch streams from '" << streaming << "'";
  cluster_->Kill(victim);
  std::vector<int64_t> revisions;
  for (const char* key : {"w/c", "w/d", "w/e"}) {
    absl::StatusOr<int64_t> revision = CreateOnce(*client, key, "after");
    ASSERT_TRUE(revision.ok()) << revision.status();
    revisions.push_back(*revision);
  }
  events = Events(*watch, 3);
  ASSERT_EQ(events.size(), 3u) << Describe(events);
  std::vector<std::pair<std::string, int64_t>> seen;
  for (const WatchEvent& event : events) seen.emplace_back(event.kv.key, event.kv.mod_revision);
  EXPECT_THAT(seen, ElementsAre(std::pair<std::string, int64_t>("w/c", revisions[0]),
                                std::pair<std::string, int64_t>("w/d", revisions[1]),
                                std::pair<std::string, int64_t>("w/e", revisions[2])));
  EXPECT_THAT(watch->member(), Not(streaming));
  EXPECT_EQ(watch->next_revision(), revisions[2] + 1);
  // Nothing more (no duplicate of a resumed event).
  absl::StatusOr<WatchResponse> more = watch->Next(absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(more.status())) << more.status();
  watch->Cancel();
  EXPECT_TRUE(absl::IsCancelled(watch->Next(absl::Seconds(1)).status()));
}

TEST_F(EtcdClientTest, AStoppedMemberIsSkippedByCallsAndByAWatch) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<PutResult> a = client->Put("s/a", "1");
  ASSERT_TRUE(a.ok()) << a.status();
  WatchOptions options;
  options.range_end = PrefixEnd("s/");
  options.start_revision = a->revision;
  std::unique_ptr<EtcdWatch> watch = client->Watch("s/", options);
  ASSERT_EQ(Events(*watch, 1).size(), 1u);

  // SIGSTOP, not SIGKILL: the member's connections stay open and silent. Calls move on after
  // the attempt timeout; the watch after gRPC's keepalive gives up on the connection.
  const std::string streaming = watch->member();
  const int victim = cluster_->IndexOf(streaming);
  ASSERT_GE(victim, 0) << "the watch streams from '" << streaming << "'";
  cluster_->Signal(victim, SIGSTOP);
  ASSERT_TRUE(WaitUntil([&] { return cluster_->stopped(victim); }, 5000));
  std::vector<int64_t> revisions;
  for (const char* key : {"s/b", "s/c"}) {
    absl::StatusOr<int64_t> revision = CreateOnce(*client, key, "during");
    ASSERT_TRUE(revision.ok()) << revision.status();
    revisions.push_back(*revision);
  }
  // Something outside this test continued the member (seen once on a shared machine: it then
  // served the calls as if never stopped); say so rather than fail below for no visible reason.
  ASSERT_TRUE(cluster_->stopped(victim))
      << "member " << streaming << " is no longer stopped: another process sent it SIGCONT";
  EXPECT_NE(client->current_member(), streaming);
  std::vector<WatchEvent> events = Events(*watch, 2);
  ASSERT_EQ(events.size(), 2u) << Describe(events) << " puts at " << revisions[0] << ", "
                               << revisions[1];
  EXPECT_EQ(events[0].kv.key, "s/b");
  EXPECT_EQ(events[0].kv.mod_revision, revisions[0]);
  EXPECT_EQ(events[1].kv.key, "s/c");
  EXPECT_EQ(events[1].kv.mod_revision, revisions[1]);
  EXPECT_NE(watch->member(), streaming);
  cluster_->Signal(victim, SIGCONT);
}

TEST_F(EtcdClientTest, AWatchFromBelowTheCompactedRevisionReportsTheCompaction) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<int64_t> revisions;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<PutResult> put = client->Put("c/x", std::to_string(i));
    ASSERT_TRUE(put.ok()) << put.status();
    revisions.push_back(put->revision);
  }
  ASSERT_TRUE(client->Compact(revisions[3]).ok());

  WatchOptions from;
  from.start_revision = revisions[0];
  std::unique_ptr<EtcdWatch> watch = client->Watch("c/x", from);
  absl::StatusOr<WatchResponse> response = watch->Next(absl::Seconds(20));
  ASSERT_EQ(response.status().code(), absl::StatusCode::kOutOfRange) << response.status();
  EXPECT_THAT(std::string(response.status().message()), HasSubstr("compacted"));
  EXPECT_EQ(CompactRevisionOf(response.status()), revisions[3]);
  // The watch is over.
  EXPECT_EQ(watch->Next(absl::Milliseconds(10)).status().code(), absl::StatusCode::kOutOfRange);

  // From the compaction's revision on, every later event is there.
  from.start_revision = revisions[3];
  watch = client->Watch("c/x", from);
  std::vector<WatchEvent> events = Events(*watch, 2);
  ASSERT_EQ(events.size(), 2u) << Describe(events);
  EXPECT_EQ(events[0].kv.mod_revision, revisions[3]);
  EXPECT_EQ(events[1].kv.value, "4");
  // A read below the compaction fails the same way, naming the RPC.
  RangeOptions at;
  at.revision = revisions[0];
  absl::StatusOr<RangeResult> old = client->Range("c/x", at);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kOutOfRange) << old.status();
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("etcd: Range on 127.0.0.1:"));
}

TEST_F(EtcdClientTest, AClientKeepsWorkingWithinASecondAfterItsMemberIsKilled) {
  // The client talks to a follower first (a leader's death would add an election to the test).
  absl::StatusOr<int> leader = cluster_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  const int follower = (*leader + 1) % cluster_->size();
  std::string address(kEtcdScheme);
  address += cluster_->client_endpoint(follower);
  for (int i = 0; i < cluster_->size(); ++i) {
    if (i != follower) address += "," + cluster_->client_endpoint(i);
  }
  // Every call must be answered within a second, retries on other members included.
  EtcdClientOptions options;
  options.address = address;
  options.call_timeout = absl::Seconds(1);
  options.attempt_timeout = absl::Milliseconds(500);
  auto client = Connect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("k/before", "1").ok());
  ASSERT_EQ(client->current_member(), cluster_->client_endpoint(follower));

  cluster_->Kill(follower);
  absl::StatusOr<PutResult> put = client->Put("k/after", "2");
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<RangeResult> range = client->Range("k/", Prefix("k/"));
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->kvs.size(), 2u);
  EXPECT_NE(client->current_member(), cluster_->client_endpoint(follower));

  // With no member left, a call fails naming the RPC and every member.
  for (int i = 0; i < cluster_->size(); ++i) cluster_->Kill(i);
  absl::StatusOr<PutResult> none = client->Put("k/none", "3");
  ASSERT_EQ(none.status().code(), absl::StatusCode::kUnavailable) << none.status();
  for (int i = 0; i < cluster_->size(); ++i) {
    EXPECT_THAT(std::string(none.status().message()), HasSubstr(cluster_->client_endpoint(i)));
  }
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("etcd: Put: no member answered"));
}

TEST_F(EtcdClientTest, AfterTheLeaderIsKilledCallsAndWatchesGoOnUnderTheNextLeader) {
  absl::StatusOr<int> leader = cluster_->Leader();
  ASSERT_TRUE(leader.ok()) << leader.status();
  // The client and its watch start on the leader.
  std::string address(kEtcdScheme);
  address += cluster_->client_endpoint(*leader);
  for (int i = 0; i < cluster_->size(); ++i) {
    if (i != *leader) address += "," + cluster_->client_endpoint(i);
  }
  EtcdClientOptions options;
  options.address = address;
  // What is checked is that calls go on under the next leader, not how fast: on a loaded machine
  // (CI's parallel tests) the election took over the default 5 s.
  options.call_timeout = absl::Seconds(30);
  auto client = Connect(options);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<PutResult> first = client->Put("ld/0", "before");
  ASSERT_TRUE(first.ok()) << first.status();
  WatchOptions from;
  from.range_end = PrefixEnd("ld/");
  from.start_revision = first->revision;
  std::unique_ptr<EtcdWatch> watch = client->Watch("ld/", from);
  ASSERT_EQ(Events(*watch, 1).size(), 1u);
  ASSERT_EQ(watch->member(), cluster_->client_endpoint(*leader));

  // Writes wait out the election inside the call (the survivors answer Unavailable, "no
  // leader" or "leader changed", until one is elected); CreateOnce keeps a retried write from
  // counting twice.
  cluster_->Kill(*leader);
  std::vector<int64_t> revisions;
  for (const char* key : {"ld/1", "ld/2"}) {
    absl::StatusOr<int64_t> revision = CreateOnce(*client, key, "after");
    ASSERT_TRUE(revision.ok()) << revision.status();
    revisions.push_back(*revision);
  }
  std::vector<WatchEvent> events = Events(*watch, 2);
  ASSERT_EQ(events.size(), 2u) << Describe(events);
  EXPECT_EQ(events[0].kv.key, "ld/1");
  EXPECT_EQ(events[0].kv.mod_revision, revisions[0]);
  EXPECT_EQ(events[1].kv.key, "ld/2");
  EXPECT_EQ(events[1].kv.mod_revision, revisions[1]);
  absl::StatusOr<RangeResult> range = client->Range("ld/", Prefix("ld/"));
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->kvs.size(), 3u);
  absl::StatusOr<int> next = cluster_->Leader();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(*next, *leader);
}

TEST_F(EtcdClientTest, AKilledMemberThatIsRestartedServesTheClientAgain) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("r/a", "1").ok());
  const int victim = cluster_->IndexOf(client->current_member());
  ASSERT_GE(victim, 0);
  cluster_->Kill(victim);
  ASSERT_TRUE(client->Put("r/b", "2").ok());
  EXPECT_FALSE(client->Status(victim).ok());

  ASSERT_TRUE(cluster_->Restart(victim).ok());
  const absl::Time restarted = absl::Now();
  // The client's channel to it comes back by itself (gRPC reconnects with backoff). How long
  // that takes is logged, not asserted: 9-13 s when the client asks from the moment the member
  // starts (docs/design/etcd.md, "A restarted member", an open finding).
  ASSERT_TRUE(WaitUntil([&] { return client->Status(victim).ok(); }, 60000, 100))
      << cluster_->Logs();
  CONNEX_LOG_INFO("the restarted member answered the client after {} ms",
                  absl::ToInt64Milliseconds(absl::Now() - restarted));
  // It caught up with what was written while it was down.
  absl::StatusOr<MemberStatus> status = client->Status(victim);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_NE(status->leader_id, 0u);
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<MemberStatus> s = client->Status(victim);
        return s.ok() && s->revision >= 3;
      },
      10000));
}

TEST_F(EtcdClientTest, WithAuthOnlyTheRightUserAndPasswordGetIn) {
  if (EtcdCluster::FindBinary("etcdctl").empty()) {
    GTEST_SKIP() << "etcdctl is not installed: scripts/install-deps.sh installs etcd-client";
  }
  ASSERT_TRUE(cluster_->Etcdctl({"user", "add", "root:rootpw", "--interactive=false"}).ok());
  absl::StatusOr<std::string> enabled = cluster_->Etcdctl({"auth", "enable"});
  ASSERT_TRUE(enabled.ok()) << enabled.status();

  EtcdClientOptions options;
  options.address = cluster_->address();
  options.user = "root";
  options.password = "rootpw";
  auto client = Connect(options);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("a/k", "v").ok());
  absl::StatusOr<RangeResult> range = client->Range("a/k");
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 1u);
  // Streams carry the token too.
  WatchOptions from;
  from.start_revision = range->revision;
  std::unique_ptr<EtcdWatch> watch = client->Watch("a/k", from);
  std::vector<WatchEvent> events = Events(*watch, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kv.value, "v");

  options.password = "wrong";
  absl::StatusOr<std::unique_ptr<EtcdClient>> refused = EtcdClient::Connect(options);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("invalid user ID or password"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("etcd auth as user 'root'"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("Authenticate on 127.0.0.1:"));

  // Without credentials a call is refused, naming the RPC and the member.
  auto anonymous = Connect();
  ASSERT_NE(anonymous, nullptr);
  absl::StatusOr<PutResult> put = anonymous->Put("a/k", "x");
  ASSERT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << put.status();
  EXPECT_THAT(std::string(put.status().message()), HasSubstr("user name is empty"));
  EXPECT_THAT(std::string(put.status().message()), HasSubstr("etcd: Put on 127.0.0.1:"));
}

TEST(EtcdTlsTest, OverTlsOnlyAClientWithACertificateOfTheClusterCaGetsIn) {
  if (EtcdCluster::FindEtcd().empty()) GTEST_SKIP() << EtcdCluster::kSkipMessage;
  if (EtcdCluster::FindBinary("openssl").empty()) {
    GTEST_SKIP() << "openssl is not installed: it makes the TLS cluster's certificates";
  }
  EtcdClusterOptions cluster_options;
  cluster_options.dir = ::testing::TempDir();
  cluster_options.tls = true;
  auto cluster = EtcdCluster::Start(cluster_options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const testing::EtcdTlsFiles& files = (*cluster)->tls_files();

  EtcdClientOptions options;
  options.address = (*cluster)->address();
  options.tls.ca_file = files.ca_file;
  options.tls.cert_file = files.client_cert_file;
  options.tls.key_file = files.client_key_file;
  auto client = EtcdClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<PutResult> put = (*client)->Put("tls/k", "v");
  ASSERT_TRUE(put.ok()) << put.status();
  absl::StatusOr<RangeResult> range = (*client)->Range("tls/k");
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 1u);
  WatchOptions from;
  from.start_revision = put->revision;
  std::unique_ptr<EtcdWatch> watch = (*client)->Watch("tls/k", from);
  absl::StatusOr<WatchResponse> response = watch->Next(absl::Seconds(20));
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->events.size(), 1u);
  watch.reset();

  // Without a client certificate, or without TLS, no member lets the client in.
  options.call_timeout = absl::Seconds(1);
  options.attempt_timeout = absl::Milliseconds(300);
  for (bool with_tls : {true, false}) {
    EtcdClientOptions stranger = options;
    stranger.tls.cert_file.clear();
    stranger.tls.key_file.clear();
    if (!with_tls) stranger.tls.ca_file.clear();
    auto refused = EtcdClient::Connect(stranger);
    ASSERT_TRUE(refused.ok()) << refused.status();
    absl::StatusOr<PutResult> denied = (*refused)->Put("tls/k", "x");
    EXPECT_EQ(denied.status().code(), absl::StatusCode::kUnavailable) << denied.status();
    EXPECT_THAT(std::string(denied.status().message()), HasSubstr("etcd: Put: no member answered"));
  }
}

}  // namespace
}  // namespace connex::directory::etcd
