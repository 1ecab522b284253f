// The DirectoryClient's rules, one suite run against every backend: the embedded directory
// (a DirectoryServer in this process) and, built with CONNEX_CONFORMANCE_ETCD, a real 3-member
// etcd cluster. The client above the store is written once (internal/store.h); this
// suite is what holds both stores to it. Each test uses a model of its own, so that the etcd
// cluster can be shared by the whole suite.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "connex/base/mutex.h"
#include "connex/directory/client.h"
#include "connex/directory/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#if CONNEX_CONFORMANCE_ETCD
#include "connex/directory/etcd/etcd_backend.h"
#include "connex/directory/etcd/testing/etcd_cluster.h"
#endif

namespace connex::directory {
namespace {

using ::testing::HasSubstr;

constexpr char kAdmin[] = "conformance-admin-secret";
constexpr int64_t kWaitMs = 20000;  // a deadline for conditions, never a duration waited out

// Events a subscriber saw.
class EventLog {
 public:
  void Add(const Event& e) {
    MutexLock lock(&mu_);
    events_.push_back(e);
  }
  bool Has(EventKind kind, const Lid& lid, uint64_t epoch = 0) const {
    MutexLock lock(&mu_);
    for (const Event& e : events_) {
      if (e.kind == kind && e.record.lid == lid && (epoch == 0 || e.record.epoch == epoch)) {
        return true;
      }
    }
    return false;
  }
  size_t size() const {
    MutexLock lock(&mu_);
    return events_.size();
  }
  // Waits (with a deadline) until Has(kind, lid, epoch).
  bool Await(EventKind kind, const Lid& lid, uint64_t epoch = 0) const {
    MutexLock lock(&mu_);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const Event& e : events_) {
        if (e.kind == kind && e.record.lid == lid && (epoch == 0 || e.record.epoch == epoch)) {
          return true;
        }
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&has), absl::Milliseconds(kWaitMs));
  }

 private:
  mutable Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

// Registration changes a holder was told of.
class ChangeLog {
 public:
  void Add(const RegistrationChange& c) {
    MutexLock lock(&mu_);
    changes_.push_back(c);
  }
  // Waits (with a deadline) for a change of `lid`, and returns the first.
  std::optional<RegistrationChange> Await(const Lid& lid) const {
    MutexLock lock(&mu_);
    auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& c : changes_) {
        if (c.lid == lid) return true;
      }
      return false;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&has), absl::Milliseconds(kWaitMs))) {
      return std::nullopt;
    }
    for (const auto& c : changes_) {
      if (c.lid == lid) return c;
    }
    return std::nullopt;
  }

 private:
  mutable Mutex mu_;
  std::vector<RegistrationChange> changes_ ABSL_GUARDED_BY(mu_);
};

#if CONNEX_CONFORMANCE_ETCD
[[maybe_unused]] const bool kEtcdBackend = (RegisterEtcdBackend(), true);
#endif

// One backend: where clients connect.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string address() const = 0;
};

class EmbeddedBackend final : public Backend {
 public:
  EmbeddedBackend() {
    DirectoryServerOptions options;
    options.bind = "tcp://127.0.0.1:0";
    options.pub = "tcp://127.0.0.1:0";
    options.lease_ttl_ms = 3000;
    options.heartbeat_ms = 300;
    options.tick_ms = 50;
    options.admin_token = kAdmin;
    auto server = DirectoryServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = *std::move(server);
  }
  std::string address() const override { return server_ ? server_->bind_address() : ""; }

 private:
  std::unique_ptr<DirectoryServer> server_;
};

#if CONNEX_CONFORMANCE_ETCD
class EtcdBackend final : public Backend {
 public:
  EtcdBackend() {
    etcd::testing::EtcdClusterOptions options;
    options.dir = ::testing::TempDir();
    auto cluster = etcd::testing::EtcdCluster::Start(options);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (cluster.ok()) cluster_ = *std::move(cluster);
  }
  std::string address() const override { return cluster_ ? cluster_->address() : ""; }

 private:
  std::unique_ptr<etcd::testing::EtcdCluster> cluster_;
};
#endif

class ClientConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void TearDownTestSuite() {
    embedded_.reset();
#if CONNEX_CONFORMANCE_ETCD
    etcd_.reset();
#endif
  }

  void SetUp() override {
#if CONNEX_CONFORMANCE_ETCD
    if (GetParam() == "etcd") {
      if (etcd::testing::EtcdCluster::FindEtcd().empty()) {
        GTEST_SKIP() << etcd::testing::EtcdCluster::kSkipMessage;
      }
      if (!etcd_) etcd_ = std::make_unique<EtcdBackend>();
      backend_ = etcd_.get();
    }
#endif
    if (GetParam() == "embedded") {
      if (!embedded_) embedded_ = std::make_unique<EmbeddedBackend>();
      backend_ = embedded_.get();
    }
    ASSERT_NE(backend_, nullptr);
    ASSERT_FALSE(backend_->address().empty());
    static std::atomic<int> next_model{0};
    model_ = "conf" + std::to_string(next_model.fetch_add(1));
  }

  std::unique_ptr<DirectoryClient> Client(bool admin = false) {
    DirectoryClientOptions options;
    options.directory = backend_->address();
    options.request_timeout_ms = 5000;
    options.heartbeat_ms = 300;
    options.etcd.lease_ttl_ms = 3000;
    options.join_waits_for_lease = false;
    if (admin) options.admin_token = kAdmin;
    auto client = DirectoryClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<DirectoryClient> Watcher(EventLog* log) {
    auto w = Client();
    w->Subscribe([log](const Event& e) { log->Add(e); });
    absl::Status watching = w->Watch(model_);
    EXPECT_TRUE(watching.ok()) << watching;
    return w;
  }

  Lid lid(uint32_t replica) const { return Lid{model_, 1, 0, replica}; }

  // Whether `watcher`'s view comes to hold `lid` at `epoch` (0: does not hold `lid`).
  bool ViewHolds(const DirectoryClient& watcher, const Lid& lid, uint64_t epoch) const {
    return watcher.AwaitView(
        model_,
        [&](const std::vector<Record>& records) {
          for (const Record& r : records) {
            if (r.lid == lid) return r.epoch == epoch;
          }
          return epoch == 0;
        },
        kWaitMs);
  }

  static std::unique_ptr<Backend> embedded_;
#if CONNEX_CONFORMANCE_ETCD
  static std::unique_ptr<Backend> etcd_;
#endif
  Backend* backend_ = nullptr;
  std::string model_;
};

std::unique_ptr<Backend> ClientConformanceTest::embedded_;
#if CONNEX_CONFORMANCE_ETCD
std::unique_ptr<Backend> ClientConformanceTest::etcd_;
#endif

TEST_P(ClientConformanceTest, JoinMigrateAndLeaveAreSeenByAWatcher) {
  EventLog log;
  auto watcher = Watcher(&log);
  auto holder = Client();
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:5555"}, {{"stage", "0"}});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(holder->EpochOf(lid(0)), *epoch);
  ASSERT_TRUE(ViewHolds(*watcher, lid(0), *epoch));
  EXPECT_TRUE(log.Await(EventKind::kJoined, lid(0), *epoch));
  std::vector<Record> view = watcher->View(model_, 1);
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(view[0].addresses, std::vector<std::string>{"tcp://127.0.0.1:5555"});
  EXPECT_EQ(view[0].metadata.at("stage"), "0");

  // Joining again with other addresses is a migration: a new epoch, MIGRATED.
  auto moved = holder->Join(lid(0), {"tcp://127.0.0.1:5556"}, {{"stage", "0"}});
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_GT(*moved, *epoch);
  ASSERT_TRUE(ViewHolds(*watcher, lid(0), *moved));
  EXPECT_TRUE(log.Await(EventKind::kMigrated, lid(0), *moved));

  ASSERT_TRUE(holder->Leave(lid(0)).ok());
  EXPECT_EQ(holder->EpochOf(lid(0)), std::nullopt);
  ASSERT_TRUE(ViewHolds(*watcher, lid(0), 0));
  EXPECT_TRUE(log.Await(EventKind::kLeft, lid(0), *moved));
  EXPECT_EQ(holder->Leave(lid(0)).code(), absl::StatusCode::kNotFound);
}

TEST_P(ClientConformanceTest, ASecondHolderOfALiveLidIsRefused) {
  auto first = Client();
  auto second = Client();
  auto epoch = first->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  auto refused = second->Join(lid(0), {"tcp://127.0.0.1:2"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("epoch " + std::to_string(*epoch)));
  EXPECT_EQ(second->EpochOf(lid(0)), std::nullopt);
}

TEST_P(ClientConformanceTest, AReportedHolderJoinsAgainUnderANewEpoch) {
  EventLog log;
  auto watcher = Watcher(&log);
  auto holder = Client();
  ChangeLog changes;
  holder->OnRegistrationChange([&](const RegistrationChange& c) { changes.Add(c); });
  std::shared_ptr<const HeldLease> lease = holder->Lease(lid(0));  // asked before the Join
  EXPECT_EQ(lease->epoch(), 0u);
  EXPECT_FALSE(lease->held());
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(lease->epoch(), *epoch);
  EXPECT_TRUE(lease->held());
  // A member of the model vouches for the report with the credential of a LID it holds.
  auto reporter = Client();
  ASSERT_TRUE(reporter->Join(lid(1), {"tcp://127.0.0.1:2"}).ok());
  auto evicted = reporter->ReportFailed(lid(0), *epoch, "conformance");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_TRUE(*evicted);
  EXPECT_TRUE(log.Await(EventKind::kFailed, lid(0), *epoch));

  std::optional<RegistrationChange> change = changes.Await(lid(0));
  ASSERT_TRUE(change.has_value());
  EXPECT_TRUE(change->status.ok()) << change->status;
  EXPECT_EQ(change->old_epoch, *epoch);
  EXPECT_GT(change->new_epoch, *epoch);
  EXPECT_FALSE(change->left);
  EXPECT_EQ(holder->EpochOf(lid(0)), change->new_epoch);
  EXPECT_TRUE(ViewHolds(*watcher, lid(0), change->new_epoch));
  // The lease says both: the evicted epoch, and the new one it is held under.
  EXPECT_EQ(lease->evicted_epoch(), *epoch);
  EXPECT_FALSE(lease->eviction().empty());
  EXPECT_EQ(lease->epoch(), change->new_epoch);
  EXPECT_TRUE(lease->held());
  EXPECT_TRUE(lease->lost().ok()) << lease->lost();
  EXPECT_EQ(holder->Lease(lid(0)), lease);  // one handle per LID
  // The same epoch reported again: already gone.
  auto again = reporter->ReportFailed(lid(0), *epoch, "conformance");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
}

TEST_P(ClientConformanceTest, AReportNeedsAMemberOfTheModelOrTheAdminToken) {
  auto holder = Client();
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  auto stranger = Client();
  EXPECT_EQ(stranger->ReportFailed(lid(0), *epoch, "stranger").status().code(),
            absl::StatusCode::kPermissionDenied);
  // A LID never vouches for a report of itself.
  EXPECT_EQ(holder->ReportFailed(lid(0), *epoch, "itself").status().code(),
            absl::StatusCode::kPermissionDenied);
  auto operator_client = Client(/*admin=*/true);
  auto evicted = operator_client->ReportFailed(lid(0), *epoch, "operator");
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_TRUE(*evicted);
}

TEST_P(ClientConformanceTest, AnOperatorsTakeoverMakesTheHolderGiveTheLidUp) {
  auto holder = Client();
  ChangeLog changes;
  holder->OnRegistrationChange([&](const RegistrationChange& c) { changes.Add(c); });
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_EQ(Client()->ForceJoin(lid(0), {"tcp://127.0.0.1:2"}).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto taker = Client(/*admin=*/true);
  auto taken = taker->ForceJoin(lid(0), {"tcp://127.0.0.1:2"});
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_GT(*taken, *epoch);
  // The holder asks at once: its epoch is no longer held (and it gives the LID up).
  EXPECT_EQ(holder->Renew(lid(0)).status().code(), absl::StatusCode::kFailedPrecondition);
  std::optional<RegistrationChange> change = changes.Await(lid(0));
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->status.code(), absl::StatusCode::kFailedPrecondition) << change->status;
  EXPECT_EQ(change->new_epoch, 0u);
  EXPECT_FALSE(change->left);
  EXPECT_EQ(holder->EpochOf(lid(0)), std::nullopt);
  std::shared_ptr<const HeldLease> lease = holder->Lease(lid(0));
  EXPECT_FALSE(lease->held());
  EXPECT_EQ(lease->lost().code(), absl::StatusCode::kFailedPrecondition) << lease->lost();
  EXPECT_FALSE(lease->ended_by_leave());
  EXPECT_EQ(lease->epoch(), *epoch);  // the last one held
  EXPECT_EQ(lease->evicted_epoch(), *epoch);
  // Renewing what it no longer holds is NotFound; its Leave is too.
  EXPECT_EQ(holder->Renew(lid(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(holder->Leave(lid(0)).code(), absl::StatusCode::kNotFound);
}

TEST_P(ClientConformanceTest, AnOperatorsDrainIsMarkedLeft) {
  auto holder = Client();
  ChangeLog changes;
  holder->OnRegistrationChange([&](const RegistrationChange& c) { changes.Add(c); });
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  absl::Status refused = Client()->Evict(lid(0));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("admin token"));
  ASSERT_TRUE(Client(/*admin=*/true)->Evict(lid(0)).ok());
  std::optional<RegistrationChange> change = changes.Await(lid(0));
  ASSERT_TRUE(change.has_value());
  EXPECT_TRUE(change->left) << change->status;
  EXPECT_EQ(change->new_epoch, 0u);
  EXPECT_EQ(holder->EpochOf(lid(0)), std::nullopt);
  std::shared_ptr<const HeldLease> lease = holder->Lease(lid(0));
  EXPECT_FALSE(lease->held());
  EXPECT_TRUE(lease->ended_by_leave());
  EXPECT_EQ(lease->evicted_epoch(), 0u);  // a drain is no eviction
}

// A holder that watches its model sees the LEFT of an operator's drain in its lease (or, when
// its renewal came first, the loss by a LEAVE), never its own LEAVE's.
TEST_P(ClientConformanceTest, TheLeaseOfAWatchingHolderTellsAnOperatorsDrainFromItsOwnLeave) {
  EventLog log;
  auto holder = Client();
  holder->Subscribe([&log](const Event& e) { log.Add(e); });
  ASSERT_TRUE(holder->Watch(model_).ok());
  auto own = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_TRUE(holder->Leave(lid(0)).ok());
  EXPECT_TRUE(log.Await(EventKind::kLeft, lid(0), *own));
  std::shared_ptr<const HeldLease> left = holder->Lease(lid(0));
  EXPECT_FALSE(left->drained());
  EXPECT_FALSE(left->ended_by_leave());
  EXPECT_EQ(left->evicted_epoch(), 0u);

  auto drained = holder->Join(lid(1), {"tcp://127.0.0.1:2"});
  ASSERT_TRUE(drained.ok()) << drained.status();
  ASSERT_TRUE(Client(/*admin=*/true)->Evict(lid(1)).ok());
  EXPECT_TRUE(log.Await(EventKind::kLeft, lid(1), *drained));
  std::shared_ptr<const HeldLease> lease = holder->Lease(lid(1));
  EXPECT_TRUE(lease->drained() || lease->ended_by_leave());
  EXPECT_EQ(lease->evicted_epoch(), 0u);
}

TEST_P(ClientConformanceTest, RenewConfirmsTheEpochAndTheLeaseIsReadable) {
  auto holder = Client();
  EXPECT_EQ(holder->Renew(lid(0)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(holder->LeaseLeftMs(lid(0)), std::nullopt);
  EXPECT_EQ(holder->RenewalAgeMs(lid(0)), std::nullopt);
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  auto renewed = holder->Renew(lid(0));
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(*renewed, *epoch);
  std::optional<int64_t> left = holder->LeaseLeftMs(lid(0));
  ASSERT_TRUE(left.has_value());
  EXPECT_GT(*left, 0);
  EXPECT_LE(*left, holder->lease_ttl_ms());
  std::optional<int64_t> age = holder->RenewalAgeMs(lid(0));
  ASSERT_TRUE(age.has_value());
  EXPECT_GE(*age, 0);
  EXPECT_EQ(holder->heartbeat_ms(), 300);
}

TEST_P(ClientConformanceTest, AFreedLidIsLeftWithoutErrorByItsFormerHolder) {
  // Leave of a LID whose epoch the directory no longer holds (evicted; the holder not told
  // yet, or told and rejoined): nothing is left to leave, and Leave says OK.
  auto holder = Client();
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  ASSERT_TRUE(Client(/*admin=*/true)->ReportFailed(lid(0), *epoch, "operator").ok());
  EXPECT_TRUE(holder->Leave(lid(0)).ok());
  EXPECT_EQ(holder->EpochOf(lid(0)), std::nullopt);
}

TEST_P(ClientConformanceTest, DroppedEventsAreRecoveredByAFreshSnapshot) {
  EventLog log;
  auto watcher = Watcher(&log);
  auto holder = Client();
  watcher->DropEventsForTest(1);
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  // The JOINED was dropped: the view comes to hold the LID through a fresh snapshot, and the
  // subscriber is told what it missed.
  ASSERT_TRUE(ViewHolds(*watcher, lid(0), *epoch));
  EXPECT_TRUE(log.Await(EventKind::kJoined, lid(0), *epoch));
  EXPECT_GE(watcher->resnapshots(), 1u);
  EXPECT_GE(watcher->events_received(), 1u);
}

TEST_P(ClientConformanceTest, DelayedEventsReachSubscribersLaterAndInOrder) {
  EventLog log;
  auto watcher = Watcher(&log);
  watcher->DelayEventsForTest(2000);
  auto holder = Client();
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  ASSERT_TRUE(holder->Leave(lid(0)).ok());
  // The view is not delayed; subscribers are (2 s, far longer than this check takes).
  ASSERT_TRUE(ViewHolds(*watcher, lid(0), 0));
  EXPECT_FALSE(log.Has(EventKind::kJoined, lid(0), *epoch));
  ASSERT_TRUE(log.Await(EventKind::kLeft, lid(0), *epoch));
  EXPECT_TRUE(log.Has(EventKind::kJoined, lid(0), *epoch));
  EXPECT_EQ(log.size(), 2u);
}

TEST_P(ClientConformanceTest, AnUnsubscribedCallbackIsNeverCalledAgain) {
  EventLog kept, dropped;
  auto watcher = Watcher(&kept);
  uint64_t id = watcher->Subscribe([&](const Event& e) { dropped.Add(e); });
  watcher->Unsubscribe(id);
  auto holder = Client();
  auto epoch = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  ASSERT_TRUE(kept.Await(EventKind::kJoined, lid(0), *epoch));
  EXPECT_EQ(dropped.size(), 0u);
}

TEST_P(ClientConformanceTest, AWatchOfEveryModelSeesEveryModel) {
  EventLog log;
  auto watcher = Watcher(&log);  // this test's model first, then every model
  auto holder = Client();
  const Lid other{model_ + "x", 1, 0, 0};
  auto mine = holder->Join(lid(0), {"tcp://127.0.0.1:1"});
  auto theirs = holder->Join(other, {"tcp://127.0.0.1:2"});
  ASSERT_TRUE(mine.ok() && theirs.ok());
  ASSERT_TRUE(ViewHolds(*watcher, lid(0), *mine));
  EXPECT_TRUE(watcher->View(other.model).empty());  // not watched yet
  ASSERT_TRUE(watcher->Watch("").ok());
  EXPECT_TRUE(watcher->AwaitView(
      other.model, [](const std::vector<Record>& records) { return records.size() == 1; },
      kWaitMs));
  // The records it already had stay; what the wider watch added is reported.
  EXPECT_EQ(watcher->View(model_).size(), 1u);
  EXPECT_TRUE(log.Await(EventKind::kJoined, other, *theirs));
  ASSERT_TRUE(holder->Leave(other).ok());
  EXPECT_TRUE(log.Await(EventKind::kLeft, other, *theirs));
}

TEST_P(ClientConformanceTest, ASnapshotReadsTheRecordsOfAModelAndAGroup) {
  auto holder = Client();
  ASSERT_TRUE(holder->Join(lid(0), {"tcp://127.0.0.1:1"}).ok());
  ASSERT_TRUE(holder->Join(Lid{model_, 2, 0, 0}, {"tcp://127.0.0.1:2"}).ok());
  auto snapshot = Client()->GetSnapshot(model_);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->records.size(), 2u);
  auto group = Client()->GetSnapshot(model_, 2);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->records.size(), 1u);
  EXPECT_EQ(group->records[0].lid.group, 2u);
}

// One backend per binary, the same tests for each: connex_directory_conformance_test runs the
// embedded directory (label directory, under TSan too), connex_etcd_conformance_test etcd
// (label etcd: gRPC is not instrumented for TSan).
std::vector<std::string> Backends() {
#if CONNEX_CONFORMANCE_ETCD
  return {"etcd"};
#else
  return {"embedded"};
#endif
}

INSTANTIATE_TEST_SUITE_P(Backends, ClientConformanceTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace connex::directory
