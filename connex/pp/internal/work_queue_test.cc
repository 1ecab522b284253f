#include "connex/pp/internal/work_queue.h"

#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(WorkQueueTest, ItemsComeOutInOrderAndACommandWaitsForTheLoop) {
  WorkQueue<std::string> q;
  EXPECT_TRUE(q.Push("frame"));
  EXPECT_FALSE(q.PushToLoop("command"));  // no loop yet to answer it
  q.LoopStarted();
  EXPECT_TRUE(q.PushToLoop("command"));
  EXPECT_TRUE(q.Push("later"));
  EXPECT_THAT(q.Take(absl::ZeroDuration()), ElementsAre("frame", "command", "later"));
  EXPECT_THAT(q.Take(absl::ZeroDuration()), IsEmpty());
}

TEST(WorkQueueTest, TakeWakesForAnItemPostedFromAnotherThread) {
  WorkQueue<int> q;
  std::thread poster([&] { q.Push(7); });
  std::deque<int> taken;
  for (int i = 0; i < 100 && taken.empty(); ++i) taken = q.Take(absl::Milliseconds(100));
  poster.join();
  EXPECT_THAT(taken, ElementsAre(7));
}

TEST(WorkQueueTest, AClosedQueueTakesNothingAndKeepsWhatWasLeft) {
  WorkQueue<int> q;
  q.LoopStarted();
  q.Push(1);
  EXPECT_TRUE(q.Close());
  EXPECT_FALSE(q.Close());
  EXPECT_TRUE(q.closed());
  EXPECT_FALSE(q.Push(2));
  EXPECT_FALSE(q.PushToLoop(3));
  EXPECT_THAT(q.TakeAll(), ElementsAre(1));
}

}  // namespace
}  // namespace connex::pp::internal
