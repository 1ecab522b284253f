#include "connex/elastic/peer_set.h"

#include <cstdio>
#include <future>

#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/elastic/channel.h"
#include "connex/transport/mem/mem_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::elastic {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records every change as "KIND lid[@epoch] [local]".
class ChangeLog {
 public:
  explicit ChangeLog(ElasticPeerSet& peers, bool with_epochs = false) : peers_(peers) {
    id_ = peers.OnChange([this, with_epochs](const PeerChange& c) {
      connex::MutexLock lock(&mu_);
      lines_.push_back(StrCat(PeerChangeKindName(c.kind), " ", c.record.lid.ToString(),
                              with_epochs ? StrCat("@", c.record.epoch) : "",
                              c.local ? " local" : ""));
      reasons_.push_back(c.reason);
    });
  }
  std::vector<std::string> lines() const {
    connex::MutexLock lock(&mu_);
    return lines_;
  }
  std::vector<std::string> reasons() const {
    connex::MutexLock lock(&mu_);
    return reasons_;
  }
  ~ChangeLog() { peers_.RemoveCallback(id_); }
  bool Has(const std::string& line) const {
    connex::MutexLock lock(&mu_);
    return std::find(lines_.begin(), lines_.end(), line) != lines_.end();
  }

 private:
  ElasticPeerSet& peers_;
  uint64_t id_ = 0;
  mutable connex::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> reasons_ ABSL_GUARDED_BY(mu_);
};

class PeerSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = directory::testing::StartTestDirectory();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    fabric_ = transport::mem::Fabric::Create();
  }

  std::unique_ptr<directory::DirectoryClient> Client(bool rejoin = true,
                                                     int64_t request_timeout_ms = 3000) {
    directory::DirectoryClientOptions options;
    options.directory = server_->bind_address();
    options.rejoin_after_eviction = rejoin;
    options.request_timeout_ms = request_timeout_ms;
    // The test's senders hold no LID of the model; the operator's token lets them report (a
    // production sender is a member: it holds its own LID).
    options.admin_token = directory::testing::kTestAdminToken;
    auto client = directory::DirectoryClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  transport::TransferEnginePtr Engine(const Lid& lid) {
    transport::TransportOptions t;
    t.backend = transport::Backend::kMem;
    t.local_lid = lid;
    t.fabric = fabric_;
    t.suspect_ms = 100;
    auto engine = transport::CreateTransferEngine(t);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return *std::move(engine);
  }

  // A replica of group 1, as its own process would have it: a directory client, an inbox and,
  // with `transport`, a mem engine whose address it publishes too. A killed replica's client
  // does not rejoin, as a dead process would not.
  struct Replica {
    std::unique_ptr<directory::DirectoryClient> client;
    std::unique_ptr<MessageInbox> inbox;
    transport::TransferEnginePtr engine;
    uint64_t epoch = 0;
    std::string mem_address;
  };
  Replica StartReplica(uint32_t r, bool transport = false) {
    Replica replica;
    replica.client = Client(/*rejoin=*/!transport);
    replica.inbox = *MessageInbox::Start();
    std::vector<std::string> addresses{replica.inbox->address()};
    if (transport) {
      replica.engine = Engine(Lid{"demo", 1, 0, r});
      replica.mem_address = replica.engine->LocalAddresses()[0];
      addresses.push_back(replica.mem_address);
    }
    // A previous holder of the LID may still be registered until its eviction lands.
    absl::StatusOr<uint64_t> epoch;
    EXPECT_TRUE(WaitUntil(
        [&] {
          epoch = replica.client->Join(Lid{"demo", 1, 0, r}, addresses);
          return epoch.ok();
        },
        5000, /*poll_ms=*/20))
        << epoch.status();
    replica.epoch = epoch.value_or(0);
    return replica;
  }

  // Whether nobody (a fresh watcher) sees `lid` in the directory any more.
  bool GoneFromDirectory(const Lid& lid, int64_t timeout_ms = 5000) {
    auto bystander = Client();
    if (!bystander->Watch("demo").ok()) return false;
    return bystander->AwaitView(
        "demo",
        [&](const std::vector<directory::Record>& v) {
          return std::none_of(v.begin(), v.end(), [&](const auto& r) { return r.lid == lid; });
        },
        timeout_ms);
  }

  std::unique_ptr<directory::DirectoryServer> server_;
  std::shared_ptr<transport::mem::Fabric> fabric_;
  const Lid owner_lid_{"demo", 0, 0, 0};
  const Lid r0_{"demo", 1, 0, 0};
  const Lid r1_{"demo", 1, 0, 1};
};

TEST_F(PeerSetTest, ResolvesPicksAndSends) {
  Replica a = StartReplica(0);
  Replica b = StartReplica(1);
  auto owner = Client();
  ElasticPeerSet peers(*owner, {"demo", 1, /*own_replica=*/1});
  ASSERT_TRUE(peers.Start().ok());
  ASSERT_TRUE(peers.WaitReady(2, 3000));
  EXPECT_THAT(peers.PeerLids(), ElementsAre(r0_, r1_));
  EXPECT_EQ(*peers.Pick(), r1_);  // own replica first
  ASSERT_TRUE(peers.Send(r0_, "to-a").ok());
  ASSERT_TRUE(peers.Send(r1_, "to-b").ok());
  EXPECT_EQ(a.inbox->Receive(1000), "to-a");
  EXPECT_EQ(b.inbox->Receive(1000), "to-b");
  EXPECT_TRUE(peers.IsUsable(r0_, a.epoch));
  EXPECT_FALSE(peers.IsUsable(r0_, a.epoch + 1000));
  // Other groups and models are not peers.
  auto other = Client();
  ASSERT_TRUE(other->Join(Lid{"demo", 2, 0, 0}, {"zmq+tcp://127.0.0.1:1"}).ok());
  ASSERT_TRUE(other->Join(Lid{"else", 1, 0, 0}, {"zmq+tcp://127.0.0.1:1"}).ok());
  ASSERT_TRUE(owner->AwaitView(
      "demo", [](const auto& v) { return v.size() == 3; }, 3000));
  EXPECT_EQ(peers.Peers().size(), 2u);
  EXPECT_TRUE(owner->View("else").empty());  // a watcher of demo receives nothing of else
}

TEST_F(PeerSetTest, HandsOverWhenAPeerDies) {
  Replica a = StartReplica(0);
  Replica b = StartReplica(1);
  auto owner = Client();
  // No transport: the sender notices by a send timeout well inside the 1 s lease.
  ElasticPeerSet peers(*owner, {"demo", 1, 1, /*send_timeout_ms=*/100});
  ChangeLog changes(peers);
  ASSERT_TRUE(peers.Start().ok());
  ASSERT_TRUE(peers.WaitReady(2, 3000));

  // Replica 1 dies: its inbox stops answering and its process stops heartbeating.
  b.inbox->Stop();
  b.client.reset();
  absl::Status sent = peers.Send(r1_, "step-42");
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(sent.message()), HasSubstr("no acknowledgement"));
  ASSERT_TRUE(peers.MarkFailed(r1_).ok());
  EXPECT_THAT(peers.PeerLids(), ElementsAre(r0_));
  Lid next = *peers.Pick();
  EXPECT_EQ(next, r0_);  // wraps around to the surviving replica
  ASSERT_TRUE(peers.Send(next, "step-42").ok());
  EXPECT_EQ(a.inbox->Receive(1000), "step-42");
  EXPECT_EQ(peers.MarkFailed(r1_).code(), absl::StatusCode::kNotFound);

  // Everyone else hears of the eviction from the directory.
  EXPECT_TRUE(GoneFromDirectory(r1_));

  // Replica 1 rejoins under a new epoch and takes traffic again.
  Replica b2 = StartReplica(1);
  ASSERT_TRUE(peers.WaitReady(2, 3000));
  EXPECT_EQ(*peers.Pick(), r1_);
  ASSERT_TRUE(peers.Send(r1_, "back").ok());
  EXPECT_EQ(b2.inbox->Receive(1000), "back");
  ASSERT_TRUE(WaitUntil([&] { return changes.lines().size() == 4; }, 3000));
  EXPECT_THAT(changes.lines(), ElementsAre("JOINED demo/g1/s0/r0", "JOINED demo/g1/s0/r1",
                                           "FAILED demo/g1/s0/r1 local", "JOINED demo/g1/s0/r1"));
}

TEST_F(PeerSetTest, FollowsMigrationAndScaleDownWithDraining) {
  Replica a = StartReplica(0);
  Replica b = StartReplica(1);
  auto owner = Client();
  ElasticPeerSet peers(*owner, {"demo", 1, /*own_replica=*/1});
  ChangeLog changes(peers);
  ASSERT_TRUE(peers.Start().ok());
  ASSERT_TRUE(peers.WaitReady(2, 3000));

  auto moved = MessageInbox::Start();
  ASSERT_TRUE(moved.ok());
  auto epoch = a.client->Join(r0_, {(*moved)->address()});
  ASSERT_TRUE(epoch.ok());
  EXPECT_GT(*epoch, a.epoch);
  ASSERT_TRUE(WaitUntil([&] { return peers.Peers()[0].epoch == *epoch; }, 3000));
  EXPECT_FALSE(peers.IsUsable(r0_, a.epoch));
  EXPECT_TRUE(peers.IsUsable(r0_, *epoch));
  ASSERT_TRUE(peers.Send(r0_, "after-migrate").ok());
  EXPECT_EQ((*moved)->Receive(1000), "after-migrate");

  // Replica 1 leaves gracefully: draining, not failed; never picked for new work.
  ASSERT_TRUE(peers.Send(r1_, "before-leave").ok());
  ASSERT_TRUE(b.client->Leave(r1_).ok());
  ASSERT_TRUE(WaitUntil([&] { return peers.PeerLids().size() == 1; }, 3000));
  EXPECT_THAT(peers.PeerLids(), ElementsAre(r0_));
  EXPECT_EQ(peers.StateOf(r1_, b.epoch), PeerState::kDraining);
  EXPECT_FALSE(peers.IsUsable(r1_, b.epoch));
  EXPECT_EQ(*peers.Pick(&r1_), r0_);  // even a request that was on it moves on
  std::vector<PeerInfo> members = peers.Members();
  ASSERT_EQ(members.size(), 2u);  // r0@new live, r1 draining (r0@old was superseded)
  EXPECT_EQ(members[1].record.lid, r1_);
  EXPECT_EQ(members[1].state, PeerState::kDraining);
  absl::Status sent = peers.Send(r1_, "x");
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(sent.message()), HasSubstr("draining"));
  // Callbacks run just after the view changed: wait for the announcements.
  EXPECT_TRUE(WaitUntil([&] { return changes.Has("MIGRATED demo/g1/s0/r0"); }, 3000));
  EXPECT_TRUE(WaitUntil([&] { return changes.Has("LEFT demo/g1/s0/r1"); }, 3000));
  EXPECT_FALSE(changes.Has("FAILED demo/g1/s0/r1"));
}

TEST_F(PeerSetTest, NoPeersIsUnavailable) {
  auto owner = Client();
  ElasticPeerSet peers(*owner, {"demo", 1, 0});
  ASSERT_TRUE(peers.Start().ok());
  EXPECT_FALSE(peers.WaitReady(1, 50));
  EXPECT_EQ(peers.Pick().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(peers.Start().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ElasticPeerSet::Create(*owner, nullptr, {"bad model!", 1, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(PeerSetTest, TransportDeathEvictsThatIncarnationOnly) {
  Replica a = StartReplica(0, /*transport=*/true);
  Replica b = StartReplica(1, /*transport=*/true);
  auto owner = Client();
  transport::TransferEnginePtr engine = Engine(owner_lid_);
  auto peers = std::make_unique<ElasticPeerSet>(
      *owner, engine.get(), ElasticPeerSetOptions{"demo", 1, /*own_replica=*/1});
  ChangeLog changes(*peers, /*with_epochs=*/true);
  ASSERT_TRUE(peers->Start().ok());
  ASSERT_TRUE(peers->WaitReady(2, 3000));
  ASSERT_TRUE(WaitUntil([&] { return peers->stats().watches == 2; }, 3000));

  // Replica 1's process dies: its connection closes long before its lease would expire.
  const uint64_t e1 = b.epoch;
  fabric_->Kill(r1_);
  b.client.reset();
  b.inbox->Stop();
  ASSERT_TRUE(WaitUntil([&] { return !peers->IsUsable(r1_, e1); }, 3000));
  EXPECT_EQ(peers->StateOf(r1_, e1), PeerState::kFailed);
  EXPECT_EQ(*peers->Pick(&r1_), r0_);
  EXPECT_EQ(peers->stats().transport_evictions, 1u);
  // Callbacks run after the view changed: wait for the announcement.
  ASSERT_TRUE(
      WaitUntil([&] { return changes.Has(StrCat("FAILED demo/g1/s0/r1@", e1, " local")); }, 3000));
  EXPECT_THAT(changes.reasons(), ::testing::Contains(HasSubstr("transport: mem: killed")));
  // ... and reported: every sender learns it from the directory.
  EXPECT_TRUE(GoneFromDirectory(r1_));
  ASSERT_TRUE(WaitUntil([&] { return peers->stats().reports_sent == 1; }, 3000));

  // It restarts under the same LID: a new process (new address), a new epoch.
  Replica b2 = StartReplica(1, /*transport=*/true);
  ASSERT_NE(b2.mem_address, b.mem_address);
  ASSERT_TRUE(WaitUntil([&] { return peers->IsUsable(r1_, b2.epoch); }, 3000));
  ASSERT_TRUE(WaitUntil([&] { return peers->stats().watches == 3; }, 3000));

  // A late event about the previous process must not condemn the new one.
  fabric_->InjectEvent(owner_lid_, transport::PeerEvent{transport::PeerEventKind::kDead, r1_,
                                                        b.mem_address, "late: old process"});
  ASSERT_TRUE(WaitUntil([&] { return peers->stats().stale_transport_events == 1; }, 3000));
  EXPECT_TRUE(peers->IsUsable(r1_, b2.epoch));
  EXPECT_EQ(*peers->Pick(), r1_);

  // Its own death does.
  fabric_->Kill(r1_);
  ASSERT_TRUE(WaitUntil([&] { return !peers->IsUsable(r1_, b2.epoch); }, 3000));
  EXPECT_EQ(peers->stats().transport_evictions, 2u);
  EXPECT_TRUE(peers->IsUsable(r0_, a.epoch));
  EXPECT_EQ(peers->stats().stale_transport_events, 1u);  // only the injected one
}

TEST_F(PeerSetTest, AWatchThatFailsIsRetriedButIsNoEviction) {
  Replica b = StartReplica(1, /*transport=*/true);
  fabric_->Kill(r1_);  // unreachable before the sender ever connects (no event can come)
  auto owner = Client();
  transport::TransferEnginePtr engine = Engine(owner_lid_);
  ElasticPeerSetOptions options{"demo", 1, 1};
  options.watch_retry_ms = 10;
  auto peers = ElasticPeerSet::Create(*owner, engine.get(), options);
  ASSERT_TRUE(peers.ok());
  ASSERT_TRUE(WaitUntil([&] { return (*peers)->stats().watch_errors == 3; }, 5000));
  EXPECT_EQ((*peers)->stats().watches, 0u);
  // The caller's own timeouts decide; a failed connect is not proof of death.
  EXPECT_TRUE((*peers)->IsUsable(r1_, b.epoch));
}

TEST_F(PeerSetTest, ADrainingPeerThatDiesIsFailedButNotReported) {
  Replica a = StartReplica(0, /*transport=*/true);
  Replica b = StartReplica(1, /*transport=*/true);
  auto owner = Client();
  transport::TransferEnginePtr engine = Engine(owner_lid_);
  auto peers =
      std::make_unique<ElasticPeerSet>(*owner, engine.get(), ElasticPeerSetOptions{"demo", 1, 1});
  ChangeLog changes(*peers);
  ASSERT_TRUE(peers->Start().ok());
  ASSERT_TRUE(peers->WaitReady(2, 3000));
  ASSERT_TRUE(WaitUntil([&] { return peers->stats().watches == 2; }, 3000));
  ASSERT_TRUE(b.client->Leave(r1_).ok());
  ASSERT_TRUE(
      WaitUntil([&] { return peers->StateOf(r1_, b.epoch) == PeerState::kDraining; }, 3000));
  b.engine.reset();  // the process exits after draining
  ASSERT_TRUE(WaitUntil([&] { return peers->StateOf(r1_, b.epoch) == PeerState::kFailed; }, 3000));
  ASSERT_TRUE(WaitUntil([&] { return changes.lines().size() == 4; }, 3000));
  EXPECT_THAT(changes.lines(), ElementsAre("JOINED demo/g1/s0/r0", "JOINED demo/g1/s0/r1",
                                           "LEFT demo/g1/s0/r1", "FAILED demo/g1/s0/r1 local"));
  EXPECT_EQ(peers->pending_reports(), 0u);
  EXPECT_EQ(peers->stats().reports_sent, 0u);
}

TEST_F(PeerSetTest, SuspicionIsAnnouncedButNotAnEviction) {
  Replica b = StartReplica(1, /*transport=*/true);
  auto owner = Client();
  transport::TransferEnginePtr engine = Engine(owner_lid_);
  auto peers = ElasticPeerSet::Create(*owner, engine.get(), {"demo", 1, 1});
  ASSERT_TRUE(peers.ok());
  ChangeLog changes(**peers);
  ASSERT_TRUE((*peers)->WaitReady(1, 3000));
  ASSERT_TRUE(WaitUntil([&] { return (*peers)->stats().watches == 1; }, 3000));
  fabric_->Partition(owner_lid_, r1_);
  ASSERT_TRUE(WaitUntil([&] { return changes.Has("SUSPECTED demo/g1/s0/r1 local"); }, 5000));
  EXPECT_TRUE((*peers)->IsUsable(r1_, b.epoch));
  EXPECT_TRUE((*peers)->Members()[0].suspected);
  fabric_->Heal(owner_lid_, r1_);
  ASSERT_TRUE(WaitUntil([&] { return !(*peers)->Members()[0].suspected; }, 5000));
  EXPECT_TRUE((*peers)->IsUsable(r1_, b.epoch));
}

TEST_F(PeerSetTest, MarkFailedDoesNotWaitForAnUnreachableDirectory) {
  Replica b = StartReplica(1);
  // A directory request waits 2 s for an answer; a report is tried twice.
  auto owner = Client(/*rejoin=*/true, /*request_timeout_ms=*/2000);
  ElasticPeerSetOptions options{"demo", 1, 1};
  options.report_attempts = 2;
  ElasticPeerSet peers(*owner, options);
  ASSERT_TRUE(peers.Start().ok());
  ASSERT_TRUE(peers.WaitReady(1, 3000));
  server_.reset();  // the directory is gone

  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(peers.MarkFailed(r1_, b.epoch).ok());
  auto took = std::chrono::steady_clock::now() - start;
  // Evicted here at once; the report waits on the background thread.
  EXPECT_FALSE(peers.IsUsable(r1_, b.epoch));
  EXPECT_EQ(peers.Pick().status().code(), absl::StatusCode::kUnavailable);
  // Still pending: MarkFailed returned before the report's first attempt (2 s) was over.
  EXPECT_EQ(peers.pending_reports(), 1u);
  std::printf(
      "MarkFailed with the directory gone returned in %lld us\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(took).count()));
  ASSERT_TRUE(WaitUntil([&] { return peers.stats().reports_failed == 1; }, 15000));
  EXPECT_EQ(peers.pending_reports(), 0u);
  EXPECT_EQ(peers.MarkFailed(r1_, b.epoch).code(), absl::StatusCode::kNotFound);
}

TEST_F(PeerSetTest, RememberedIncarnationsAreBounded) {
  std::vector<Replica> replicas;
  for (uint32_t r = 0; r < 6; ++r) replicas.push_back(StartReplica(r));
  auto owner = Client();
  ElasticPeerSetOptions options{"demo", 1, 0};
  options.max_remembered = 2;
  ElasticPeerSet peers(*owner, options);
  ASSERT_TRUE(peers.Start().ok());
  ASSERT_TRUE(peers.WaitReady(6, 3000));
  // Four leave (draining), two are reported failed by this sender.
  for (uint32_t r = 0; r < 4; ++r)
    ASSERT_TRUE(replicas[r].client->Leave(Lid{"demo", 1, 0, r}).ok());
  ASSERT_TRUE(WaitUntil([&] { return peers.PeerLids().size() == 2; }, 3000));
  EXPECT_EQ(peers.Members().size(), 2u + 2u);  // 2 live + the 2 newest draining
  ASSERT_TRUE(peers.MarkFailed(Lid{"demo", 1, 0, 4}).ok());
  ASSERT_TRUE(peers.MarkFailed(Lid{"demo", 1, 0, 5}).ok());
  EXPECT_LE(peers.Members().size(), 2u);
  // The holders learn of their eviction and rejoin under new epochs, which supersede what is
  // remembered of the failed ones.
  ASSERT_TRUE(WaitUntil([&] { return peers.stats().reports_sent == 2; }, 5000));
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const PeerInfo& m : peers.Members()) {
          if (m.state == PeerState::kFailed) return false;
        }
        return true;
      },
      5000));
}

TEST_F(PeerSetTest, PersistentChannelAndFastFailureToADeadPeer) {
  Replica a = StartReplica(0, /*transport=*/true);
  Replica b = StartReplica(1, /*transport=*/true);
  auto owner = Client();
  transport::TransferEnginePtr engine = Engine(owner_lid_);
  ElasticPeerSetOptions options{"demo", 1, 1};
  options.send_timeout_ms = 60'000;  // a timeout would fail the test's deadline
  auto peers = ElasticPeerSet::Create(*owner, engine.get(), options);
  ASSERT_TRUE(peers.ok());
  ASSERT_TRUE((*peers)->WaitReady(2, 3000));
  ASSERT_TRUE(WaitUntil([&] { return (*peers)->stats().watches == 2; }, 3000));

  for (int i = 0; i < 20; ++i) ASSERT_TRUE((*peers)->Send(r0_, StrCat("m", i)).ok());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.inbox->Receive(1000), StrCat("m", i));
  EXPECT_EQ((*peers)->stats().channels_opened, 1u);  // one connection for twenty messages

  // Replica 1 hangs on a message (no acknowledgement) and then its process dies: the waiting
  // send fails as soon as the transport reports the death, not after its 60 s timeout.
  ASSERT_TRUE((*peers)->Send(r1_, "first").ok());
  EXPECT_EQ((*peers)->stats().channels_opened, 2u);
  b.inbox->Stop();
  auto sent = std::async(std::launch::async, [&] { return (*peers)->Send(r1_, "step-42"); });
  fabric_->Kill(r1_);
  ASSERT_EQ(sent.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::Status status = sent.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("transport: mem:"));
  // Later sends fail at once; the dead peer's channel is closed.
  EXPECT_THAT(std::string((*peers)->Send(r1_, "again").message()), HasSubstr("failed"));
  EXPECT_TRUE(WaitUntil([&] { return (*peers)->stats().open_channels == 1; }, 5000));
  ASSERT_TRUE((*peers)->Send(*(*peers)->Pick(&r1_), "step-42").ok());
  EXPECT_EQ(a.inbox->Receive(1000), "step-42");
}

TEST_F(PeerSetTest, CallersRaceWithDirectoryAndTransportEvents) {
  auto owner = Client();
  transport::TransferEnginePtr engine = Engine(owner_lid_);
  auto peers = ElasticPeerSet::Create(*owner, engine.get(), {"demo", 1, 1});
  ASSERT_TRUE(peers.ok());
  std::atomic<int> changes{0};
  uint64_t cb = (*peers)->OnChange([&](const PeerChange&) { ++changes; });
  std::atomic<bool> stop{false};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&, t] {
      while (!stop.load()) {
        absl::StatusOr<directory::Record> pick = (*peers)->PickRecord(&r1_);
        if (pick.ok()) {
          (void)(*peers)->IsUsable(pick->lid, pick->epoch);
          if (t == 0) (void)(*peers)->MarkFailed(pick->lid, pick->epoch);
          if (t == 1) (void)(*peers)->Send(pick->lid, "x");
        }
        (void)(*peers)->Members();
        (void)(*peers)->stats();
      }
    });
  }
  // Replicas come, die (transport) and leave while the callers run.
  for (int round = 0; round < 5; ++round) {
    Replica a = StartReplica(0, /*transport=*/true);
    Replica b = StartReplica(1, /*transport=*/true);
    fabric_->Kill(r0_);
    (void)b.client->Leave(r1_);
  }
  stop.store(true);
  for (auto& c : callers) c.join();
  (*peers)->RemoveCallback(cb);
  EXPECT_GT(changes.load(), 0);
  EXPECT_LE((*peers)->Members().size(), 2u + 1024u);
}

}  // namespace
}  // namespace connex::elastic
