// EtcdClient against a real 3-member etcd cluster (testing/etcd_cluster.h): options, KV calls and
// transactions, threads sharing a client, leases and their keepalive, a compacted watch, auth and
// TLS. Members killed or stopped under a client are etcd_client_failover_test.cc. Skipped, saying
// why, where etcd is not installed.
#include "connex/directory/etcd/etcd_client.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/directory/etcd/etcd_client_test_util.h"
#include "connex/directory/etcd/internal/etcd_client_impl.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {
namespace {

using ::testing::ElementsAre;
using testing::EtcdCluster;
using testing::EtcdClusterOptions;
using ::testing::HasSubstr;

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

// A member whose side of our deadline ran out (no leader, no quorum: a host cut off) answers
// UNKNOWN "context deadline exceeded": the client moves on and, if no member answers, reports a
// deadline — which the lease keeper rides out — never a refusal that would give a LID up (the
// hosts test AHostCutOffAndBackIsFenced lost its stage 1 to that once).
TEST(EtcdClientStatusTest, AMembersOwnDeadlineIsADeadlineNotARefusal) {
  const grpc::Status server_side(grpc::StatusCode::UNKNOWN, "context deadline exceeded");
  EXPECT_EQ(client_internal::CodeOf(server_side), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(client_internal::MovesOn(server_side));
  const grpc::Status other(grpc::StatusCode::UNKNOWN, "etcdserver: something else");
  EXPECT_EQ(client_internal::CodeOf(other), absl::StatusCode::kUnknown);
  EXPECT_FALSE(client_internal::MovesOn(other));
  EXPECT_TRUE(client_internal::MovesOn(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no leader")));
  EXPECT_FALSE(client_internal::MovesOn(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "")));
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
