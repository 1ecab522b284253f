// RouteTable alone, over real peer sets of an in-process directory: routes prefer the node's own
// replica, stick to a live hop, follow a migration, fail over when a hop is evicted, and say why
// no route exists.
#include "connex/pp/route_table.h"

#include "connex/base/wait.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/pp/signal_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kModel[] = "rt";

class RouteTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = directory::testing::StartTestDirectory();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    holders_ = *directory::testing::ConnectTo(*server_);
    watcher_ = *directory::testing::ConnectTo(*server_);
    ASSERT_TRUE(watcher_->Watch(kModel).ok());
  }
  void TearDown() override {
    table_.Clear();
    watcher_.reset();
    holders_.reset();
  }

  // Registers stage `stage` replica `replica` with signal address pp+mem://<tag>.
  uint64_t Register(uint32_t stage, uint32_t replica, int tag) {
    auto epoch = holders_->Join(Lid{kModel, stage, 0, replica},
                                {"pp+mem://" + std::to_string(tag), "mem://t" + std::to_string(tag),
                                 "zmq+tcp://127.0.0.1:1"});
    EXPECT_TRUE(epoch.ok()) << epoch.status();
    return *epoch;
  }

  // Peer sets for stages 1 and 2 of a three-stage pipeline, as seen by replica 1's owner.
  void StartTable() {
    for (uint32_t g = 1; g < 3; ++g) {
      elastic::ElasticPeerSetOptions o;
      o.model = kModel;
      o.group = g;
      o.own_replica = 1;
      o.shard = 0;
      o.member_address_prefix = std::string(kSignalScheme);
      auto set = std::make_unique<elastic::ElasticPeerSet>(*watcher_, nullptr, o);
      ASSERT_TRUE(set->Start().ok());
      table_.Set(g, std::move(set));
    }
  }

  static std::vector<std::string> Signals(const std::optional<std::vector<Hop>>& route) {
    std::vector<std::string> out;
    if (route) {
      for (const Hop& h : *route) out.push_back(h.signal);
    }
    return out;
  }

  std::unique_ptr<directory::DirectoryServer> server_;
  std::unique_ptr<directory::DirectoryClient> holders_;
  std::unique_ptr<directory::DirectoryClient> watcher_;
  RouteTable table_{3};
};

TEST(HopFromRecordTest, TakesTheSignalAddressAndTheTransportAddressesButNotTheChannel) {
  directory::Record r;
  r.lid = Lid{kModel, 1, 0, 0};
  r.epoch = 9;
  r.addresses = {"mem://a", "pp+tcp://127.0.0.1:5", "zmq+tcp://127.0.0.1:6", "tcp://127.0.0.1:7"};
  Hop hop = HopFromRecord(r);
  EXPECT_EQ(hop.lid, r.lid);
  EXPECT_EQ(hop.epoch, 9u);
  EXPECT_EQ(hop.signal, "pp+tcp://127.0.0.1:5");
  EXPECT_THAT(hop.addresses, ElementsAre("mem://a", "tcp://127.0.0.1:7"));
}

TEST_F(RouteTableTest, PrefersTheOwnReplicaAndSticksToALiveHop) {
  Register(1, 0, 10);
  Register(1, 1, 11);
  Register(2, 0, 20);
  StartTable();
  ASSERT_TRUE(WaitUntil([&] { return table_.Build({}).has_value(); }, 3000));
  EXPECT_THAT(Signals(table_.Build({})), ElementsAre("pp+mem://11", "pp+mem://20"));
  // A request already on replica 0 of stage 1 stays there while it is live.
  std::optional<std::vector<Hop>> on_r0 = table_.Build({});
  (*on_r0)[0].lid.replica = 0;
  EXPECT_THAT(Signals(table_.Build(*on_r0)), ElementsAre("pp+mem://10", "pp+mem://20"));
  EXPECT_EQ(table_.SignalOf(Lid{kModel, 1, 0, 0}), "pp+mem://10");
  EXPECT_EQ(table_.Problem(), "");
}

TEST_F(RouteTableTest, FollowsAMigrationAndFailsOverFromAnEvictedHop) {
  uint64_t e10 = Register(1, 0, 10);
  Register(1, 1, 11);
  Register(2, 0, 20);
  StartTable();
  ASSERT_TRUE(WaitUntil([&] { return table_.Build({}).has_value(); }, 3000));
  std::optional<std::vector<Hop>> route = table_.Build({});
  (*route)[0].lid.replica = 0;
  route = table_.Build(*route);
  ASSERT_EQ((*route)[0].epoch, e10);
  EXPECT_TRUE(table_.Usable((*route)[0].lid, e10));
  // The hop migrates: the same LID under a new epoch at a new address keeps the request there.
  uint64_t moved = Register(1, 0, 12);
  ASSERT_TRUE(WaitUntil([&] { return !table_.Usable((*route)[0].lid, e10); }, 3000));
  std::optional<std::vector<Hop>> fresh = table_.Build(*route);
  ASSERT_TRUE(fresh.has_value());
  EXPECT_EQ((*fresh)[0].lid.replica, 0u);
  EXPECT_EQ((*fresh)[0].epoch, moved);
  EXPECT_EQ((*fresh)[0].signal, "pp+mem://12");
  // Evicted: the route goes to the other replica of the stage.
  table_.MarkFailed((*fresh)[0].lid, moved);
  ASSERT_TRUE(WaitUntil([&] { return !table_.Usable((*fresh)[0].lid, moved); }, 3000));
  EXPECT_THAT(Signals(table_.Build(*fresh)), ElementsAre("pp+mem://11", "pp+mem://20"));
}

TEST_F(RouteTableTest, NamesTheStageThatHasNoLiveReplica) {
  Register(1, 0, 10);
  Register(2, 0, 20);
  StartTable();
  ASSERT_TRUE(WaitUntil([&] { return table_.Build({}).has_value(); }, 3000));
  ASSERT_TRUE(holders_->Leave(Lid{kModel, 2, 0, 0}).ok());
  ASSERT_TRUE(WaitUntil([&] { return !table_.Build({}).has_value(); }, 3000));
  EXPECT_THAT(table_.Problem(), HasSubstr("stage 2: r0@"));
  EXPECT_THAT(table_.Problem(), ::testing::Not(HasSubstr("stage 1")));
  EXPECT_EQ(table_.SignalOf(Lid{kModel, 2, 0, 0}), std::nullopt);
  // A stage this table has no peer set for has no route either.
  RouteTable empty(3);
  EXPECT_FALSE(empty.Build({}).has_value());
  EXPECT_THAT(empty.Problem(), HasSubstr("stage 1: no replica registered"));
}

TEST(DealsWithTest, TheOwnerDealsWithEveryLaterStageALaterStageWithOwnersAndTheNext) {
  EXPECT_FALSE(DealsWith(0, 0));
  EXPECT_TRUE(DealsWith(0, 1));
  EXPECT_TRUE(DealsWith(0, 3));
  EXPECT_TRUE(DealsWith(1, 0));
  EXPECT_FALSE(DealsWith(1, 1));
  EXPECT_TRUE(DealsWith(1, 2));
  EXPECT_FALSE(DealsWith(1, 3));
  EXPECT_TRUE(DealsWith(2, 0));
  EXPECT_FALSE(DealsWith(2, 1));
}

TEST_F(RouteTableTest, ASignalCountsAsContactOnlyFromALiveMember) {
  uint64_t e10 = Register(1, 0, 10);
  StartTable();
  ASSERT_TRUE(WaitUntil([&] { return table_.Usable(Lid{kModel, 1, 0, 0}, e10); }, 3000));
  const Lid self{kModel, 0, 0, 1};
  const Lid member{kModel, 1, 0, 0};
  EXPECT_TRUE(table_.FromMember(ResultSignal{1, 1, member, {}, {}, e10, 7}, self, false));
  EXPECT_FALSE(table_.FromMember(ResultSignal{1, 1, member, {}, {}, e10 + 1, 7}, self, false));
  EXPECT_TRUE(table_.FromMember(PongSignal{3, member, e10}, self, false));
  // Without an epoch: a member at the address it names.
  EXPECT_TRUE(table_.FromMember(PingSignal{3, member, "pp+mem://10"}, self, false));
  EXPECT_FALSE(table_.FromMember(PingSignal{3, member, "pp+mem://99"}, self, false));
  // An ACK counts when it matched a send; a STEP of our own as owner counts.
  EXPECT_TRUE(table_.FromMember(AckSignal{1, member, 0, ""}, self, true));
  EXPECT_FALSE(table_.FromMember(AckSignal{1, member, 0, ""}, self, false));
  StepSignal own;
  own.owner = Hop{self, 5, "pp+mem://1", {}};
  EXPECT_TRUE(table_.FromMember(own, self, false));
  own.owner.lid = Lid{kModel, 0, 0, 0};
  EXPECT_FALSE(table_.FromMember(own, self, false));
}

}  // namespace
}  // namespace connex::pp
