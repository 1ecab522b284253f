// EtcdStore against a real 3-member etcd cluster (testing/etcd_cluster.h) when things are lost: a
// store whose lease etcd lost joins again under a new epoch, a holder that stops renewing is
// FAILED when its lease runs out, and a watcher whose history was compacted (its member frozen,
// then killed) catches up from a snapshot. Skipped, saying why, where etcd is not installed.
#include <signal.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "connex/base/mutex.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_store.h"
#include "connex/directory/etcd/etcd_store_test_util.h"
#include "connex/directory/etcd/model_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::directory::etcd {
namespace {

using ::testing::HasSubstr;

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
