// EtcdClient while members fail (testing/etcd_cluster.h, killed with SIGKILL or frozen with
// SIGSTOP): calls and watches move on to another member, resume where they were, go on under the
// next leader, and come back to a member that is restarted. Skipped, saying why, where etcd is not
// installed.
#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "connex/base/logging.h"
#include "connex/base/wait.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/etcd_client_test_util.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

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

}  // namespace
}  // namespace connex::directory::etcd
