#include "connex/transport/internal/event_hub.h"

#include <atomic>

#include "connex/base/wait.h"
#include "gtest/gtest.h"

namespace connex::transport::internal {
namespace {

// Issue 9 finding 7: a StageNode that failed to start unsubscribed id 0, which never existed,
// and waited for ever for "callback 0 not running".
TEST(EventHubTest, UnsubscribingAnIdThatNeverExistedReturnsAtOnce) {
  EventHub hub;
  hub.Unsubscribe(0);
  hub.Unsubscribe(12345);
  SUCCEED();
}

TEST(EventHubTest, DeliversToSubscribersUntilTheyUnsubscribe) {
  EventHub hub;
  std::atomic<int> seen{0};
  uint64_t id = hub.Subscribe([&](const PeerEvent&) { ++seen; });
  hub.Publish(PeerEvent{});
  hub.Flush();
  EXPECT_EQ(seen.load(), 1);
  hub.Unsubscribe(id);
  hub.Publish(PeerEvent{});
  hub.Flush();
  EXPECT_EQ(seen.load(), 1);
}

}  // namespace
}  // namespace connex::transport::internal
