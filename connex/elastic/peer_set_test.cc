#include "connex/elastic/peer_set.h"

#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/elastic/channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::elastic {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class PeerSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = directory::testing::StartTestDirectory();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<directory::DirectoryClient> Client() {
    auto client = directory::testing::ConnectTo(*server_);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  // A replica of group 1: its own client (process) and inbox.
  struct Replica {
    std::unique_ptr<directory::DirectoryClient> client;
    std::unique_ptr<MessageInbox> inbox;
    uint64_t epoch = 0;
  };
  Replica StartReplica(uint32_t r) {
    Replica replica;
    replica.client = Client();
    replica.inbox = *MessageInbox::Start();
    replica.epoch = *replica.client->Join(Lid{"demo", 1, 0, r}, {replica.inbox->address()});
    return replica;
  }

  std::unique_ptr<directory::DirectoryServer> server_;
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
  // Other groups and models are not peers.
  auto other = Client();
  ASSERT_TRUE(other->Join(Lid{"demo", 2, 0, 0}, {"zmq+tcp://127.0.0.1:1"}).ok());
  ASSERT_TRUE(other->Join(Lid{"else", 1, 0, 0}, {"zmq+tcp://127.0.0.1:1"}).ok());
  ASSERT_TRUE(owner->AwaitView(
      "", [](const auto& v) { return v.size() == 4; }, 3000));
  EXPECT_EQ(peers.Peers().size(), 2u);
}

TEST_F(PeerSetTest, HandsOverWhenAPeerDies) {
  Replica a = StartReplica(0);
  Replica b = StartReplica(1);
  auto owner = Client();
  // A send timeout well inside the 600 ms lease, so that the sender, not the lease, notices.
  ElasticPeerSet peers(*owner, {"demo", 1, 1, /*send_timeout_ms=*/100});
  std::vector<std::string> changes;
  connex::Mutex mu;
  peers.OnChange([&](const PeerChange& c) {
    connex::MutexLock lock(&mu);
    changes.push_back(
        StrCat(PeerChangeKindName(c.kind), " ", c.record.lid.ToString(), c.local ? " local" : ""));
  });
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
  auto bystander = Client();
  ASSERT_TRUE(bystander->Watch("demo").ok());
  EXPECT_EQ(bystander->View("demo", 1).size(), 1u);

  // Replica 1 rejoins under a new epoch and takes traffic again.
  Replica b2 = StartReplica(1);
  ASSERT_TRUE(peers.WaitReady(2, 3000));
  EXPECT_EQ(*peers.Pick(), r1_);
  ASSERT_TRUE(peers.Send(r1_, "back").ok());
  EXPECT_EQ(b2.inbox->Receive(1000), "back");
  connex::MutexLock lock(&mu);
  EXPECT_THAT(changes, ElementsAre("JOINED demo/g1/s0/r0", "JOINED demo/g1/s0/r1",
                                   "FAILED demo/g1/s0/r1 local", "JOINED demo/g1/s0/r1"));
}

TEST_F(PeerSetTest, FollowsMigrationAndScaleDown) {
  Replica a = StartReplica(0);
  Replica b = StartReplica(1);
  auto owner = Client();
  ElasticPeerSet peers(*owner, {"demo", 1, 0});
  ASSERT_TRUE(peers.Start().ok());
  ASSERT_TRUE(peers.WaitReady(2, 3000));

  auto moved = MessageInbox::Start();
  ASSERT_TRUE(moved.ok());
  auto epoch = a.client->Join(r0_, {(*moved)->address()});
  ASSERT_TRUE(epoch.ok());
  EXPECT_GT(*epoch, a.epoch);
  ASSERT_TRUE(WaitUntil([&] { return peers.Peers()[0].epoch == *epoch; }, 3000));
  ASSERT_TRUE(peers.Send(r0_, "after-migrate").ok());
  EXPECT_EQ((*moved)->Receive(1000), "after-migrate");

  ASSERT_TRUE(b.client->Leave(r1_).ok());
  ASSERT_TRUE(WaitUntil([&] { return peers.PeerLids().size() == 1; }, 3000));
  EXPECT_THAT(peers.PeerLids(), ElementsAre(r0_));
  EXPECT_EQ(peers.Send(r1_, "x").code(), absl::StatusCode::kUnavailable);
}

TEST_F(PeerSetTest, NoPeersIsUnavailable) {
  auto owner = Client();
  ElasticPeerSet peers(*owner, {"demo", 1, 0});
  ASSERT_TRUE(peers.Start().ok());
  EXPECT_FALSE(peers.WaitReady(1, 50));
  EXPECT_EQ(peers.Pick().status().code(), absl::StatusCode::kUnavailable);
}

TEST(ChannelTest, RejectsBadAddresses) {
  zmq::context_t context(1);
  EXPECT_EQ(SendMessage(context, "tcp://127.0.0.1:1", "x", 10).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SendMessage(context, "zmq+tcp://127.0.0.1:notaport", "x", 10).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace connex::elastic
