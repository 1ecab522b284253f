#include "connex/pp/internal/loop_baton.h"

#include <atomic>
#include <thread>

#include "connex/base/wait.h"
#include "gtest/gtest.h"

namespace connex::pp::internal {
namespace {

// A call that hangs moves the loop to the follower; the old leader learns it when its call
// returns, and follows in turn.
TEST(LoopBatonTest, AHungCallMovesTheLoopToTheFollower) {
  LoopBaton baton(/*take_over_ms=*/5);
  std::atomic<bool> stop{false}, release{false}, took{false}, old_leads{true};
  std::atomic<int> blocked_result{-1};
  std::thread leader([&] {
    baton.Lead();
    blocked_result = baton.Blocking([&] {
      while (!release.load()) std::this_thread::yield();
    });
    old_leads = baton.Leads();
  });
  std::thread follower([&] {
    took = baton.Follow(stop);
    ASSERT_TRUE(baton.Leads());
  });
  follower.join();  // returns once it leads
  EXPECT_TRUE(took.load());
  release = true;
  leader.join();
  EXPECT_EQ(blocked_result.load(), 0);  // false: taken over
  EXPECT_FALSE(old_leads.load());
  EXPECT_EQ(baton.take_overs(), 1u);
}

// A call that returns before the take-over keeps the loop; a follower waits until stopped.
TEST(LoopBatonTest, AQuickCallKeepsTheLoop) {
  LoopBaton baton(/*take_over_ms=*/60'000);
  std::atomic<bool> stop{false};
  std::atomic<int> followed{-1};
  std::thread follower([&] { followed = baton.Follow(stop); });
  baton.Lead();
  int calls = 0;
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(baton.Blocking([&] { ++calls; }));
  EXPECT_EQ(calls, 100);
  EXPECT_TRUE(baton.Leads());
  stop = true;
  follower.join();
  EXPECT_EQ(followed.load(), 0);
  EXPECT_EQ(baton.take_overs(), 0u);
}

}  // namespace
}  // namespace connex::pp::internal
