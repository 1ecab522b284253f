#include "connex/elastic/channel.h"

#include <stdlib.h>

#include <future>
#include <thread>

#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::elastic {
namespace {

using ::testing::HasSubstr;

const ChannelKey kKey{Lid{"demo", 1, 0, 0}, 7};

TEST(ChannelTest, OneConnectionCarriesEveryMessage) {
  auto inbox = MessageInbox::Start();
  ASSERT_TRUE(inbox.ok()) << inbox.status();
  auto channels = MessageChannels::Start();
  ASSERT_TRUE(channels.ok()) << channels.status();
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE((*channels)->Send(kKey, (*inbox)->address(), StrCat("m", i), 3000).ok()) << i;
  }
  for (int i = 0; i < 50; ++i) EXPECT_EQ((*inbox)->Receive(1000), StrCat("m", i));
  EXPECT_EQ((*channels)->opened(), 1u);
  EXPECT_EQ((*channels)->open_channels(), 1u);

  // Concurrent senders share it too.
  std::vector<std::thread> senders;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    senders.emplace_back([&] {
      for (int i = 0; i < 10; ++i)
        ok += (*channels)->Send(kKey, (*inbox)->address(), "x", 3000).ok();
    });
  }
  for (auto& s : senders) s.join();
  EXPECT_EQ(ok.load(), 40);
  EXPECT_EQ((*channels)->opened(), 1u);
}

TEST(ChannelTest, CloseFailsAWaitingSendAtOnceWithTheReason) {
  auto inbox = MessageInbox::Start();
  ASSERT_TRUE(inbox.ok());
  (*inbox)->Stop();  // acknowledges nothing, as a dead process would
  auto channels = MessageChannels::Start();
  ASSERT_TRUE(channels.ok());
  auto sent = std::async(std::launch::async, [&] {
    return (*channels)->Send(kKey, (*inbox)->address(), "lost", /*timeout_ms=*/60'000);
  });
  // Whether Close comes before or after the send is queued, the send fails with its reason.
  (*channels)->Close(kKey, "peer demo/g1/s0/r0 epoch 7 was evicted (transport: closed)");
  ASSERT_EQ(sent.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  absl::Status status = sent.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("was evicted (transport: closed)"));
  // Later sends fail at once the same way, and the socket is closed.
  EXPECT_THAT(std::string((*channels)->Send(kKey, (*inbox)->address(), "x", 60'000).message()),
              HasSubstr("was evicted"));
  EXPECT_TRUE(WaitUntil([&] { return (*channels)->open_channels() == 0; }, 5000));
}

TEST(ChannelTest, NoAcknowledgementIsUnavailable) {
  auto inbox = MessageInbox::Start();
  ASSERT_TRUE(inbox.ok());
  (*inbox)->Stop();
  auto channels = MessageChannels::Start();
  ASSERT_TRUE(channels.ok());
  absl::Status status = (*channels)->Send(kKey, (*inbox)->address(), "x", 50);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("no acknowledgement within 50 ms"));
}

TEST(ChannelTest, CloseWhenIdleClosesAfterTheLastAcknowledgement) {
  auto inbox = MessageInbox::Start();
  ASSERT_TRUE(inbox.ok());
  auto channels = MessageChannels::Start();
  ASSERT_TRUE(channels.ok());
  ASSERT_TRUE((*channels)->Send(kKey, (*inbox)->address(), "before", 3000).ok());
  (*channels)->CloseWhenIdle(kKey, "peer demo/g1/s0/r0 epoch 7 is draining (LEFT)");
  EXPECT_TRUE(WaitUntil([&] { return (*channels)->open_channels() == 0; }, 5000));
  EXPECT_THAT(std::string((*channels)->Send(kKey, (*inbox)->address(), "after", 3000).message()),
              HasSubstr("draining"));
  // Another incarnation has a channel of its own.
  ASSERT_TRUE((*channels)->Send({kKey.first, 8}, (*inbox)->address(), "next", 3000).ok());
  EXPECT_EQ((*channels)->opened(), 2u);
}

TEST(ChannelTest, OneShotSendMessage) {
  auto inbox = MessageInbox::Start();
  ASSERT_TRUE(inbox.ok());
  zmq::context_t context(1);
  ASSERT_TRUE(SendMessage(context, (*inbox)->address(), "once", 3000).ok());
  EXPECT_EQ((*inbox)->Receive(1000), "once");
}

TEST(ChannelTest, RejectsBadAddresses) {
  zmq::context_t context(1);
  EXPECT_EQ(SendMessage(context, "tcp://127.0.0.1:1", "x", 10).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SendMessage(context, "zmq+tcp://127.0.0.1:notaport", "x", 10).code(),
            absl::StatusCode::kInvalidArgument);
  auto channels = MessageChannels::Start();
  ASSERT_TRUE(channels.ok());
  EXPECT_EQ((*channels)->Send(kKey, "tcp://127.0.0.1:1", "x", 10).code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue 12: the message channels take the deployment's CURVE keys as the directory and the
// signal sockets do: authorized senders are heard, strangers and plain senders are not.
TEST(ChannelTest, UnderCurveOnlyAuthorizedSendersAreHeard) {
  absl::StatusOr<CurveKeyPair> deploy = GenerateCurveKeyPair();
  absl::StatusOr<CurveKeyPair> other = GenerateCurveKeyPair();
  ASSERT_TRUE(deploy.ok() && other.ok());
  auto inbox = MessageInbox::Start("127.0.0.1", CurveSettings::Shared(*deploy));
  ASSERT_TRUE(inbox.ok()) << inbox.status();
  EXPECT_THAT((*inbox)->address(), HasSubstr("?curve="));

  MessageChannelsOptions member;
  member.curve = CurveSettings::Shared(*deploy);
  auto channels = MessageChannels::Start(member);
  ASSERT_TRUE(channels.ok());
  ASSERT_TRUE((*channels)->Send(kKey, (*inbox)->address(), "sealed", 3000).ok());
  EXPECT_EQ((*inbox)->Receive(1000), "sealed");

  // A stranger's key: the handshake is refused, nothing is acknowledged or received.
  MessageChannelsOptions stranger;
  stranger.curve = CurveSettings::Shared(*other);
  auto strangers = MessageChannels::Start(stranger);
  ASSERT_TRUE(strangers.ok());
  absl::Status refused = (*strangers)->Send(kKey, (*inbox)->address(), "forged", 300);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(WaitUntil([&] { return (*inbox)->connections_refused() >= 1; }, 5000));
  EXPECT_EQ((*inbox)->Receive(100), std::nullopt);

  // A sender without keys, and a CURVE sender to a plain inbox, fail at once naming why.
  zmq::context_t context(1);
  absl::Status plain = SendMessage(context, (*inbox)->address(), "x", 300);
  EXPECT_EQ(plain.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plain.message()),
              HasSubstr("the inbox uses CURVE and this sender has no key"));
  auto open = MessageInbox::Start();
  ASSERT_TRUE(open.ok());
  absl::Status mismatch = (*channels)->Send(kKey, (*open)->address(), "x", 300);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mismatch.message()), HasSubstr("the inbox does not use CURVE"));
  // A malformed key in an address is named.
  EXPECT_EQ(SendMessage(context, "zmq+tcp://127.0.0.1:1?curve=zz", "x", 10).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChannelTest, ANonLoopbackInboxNeedsCurveOrInsecure) {
  unsetenv("CONNEX_INSECURE");
  auto open = MessageInbox::Start("0.0.0.0");
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(open.status().message()), HasSubstr("--insecure"));
  absl::StatusOr<CurveKeyPair> keys = GenerateCurveKeyPair();
  ASSERT_TRUE(keys.ok());
  EXPECT_TRUE(MessageInbox::Start("0.0.0.0", CurveSettings::Shared(*keys)).ok());
  setenv("CONNEX_INSECURE", "1", 1);
  EXPECT_TRUE(MessageInbox::Start("0.0.0.0").ok());
  unsetenv("CONNEX_INSECURE");
}

}  // namespace
}  // namespace connex::elastic
