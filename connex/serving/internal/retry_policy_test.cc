#include "connex/serving/internal/retry_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving::internal {
namespace {

using Clock = RetryPolicy::Clock;
using Kind = RetryPolicy::Decision::Kind;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(RetryPolicyTest, TheFirstFailureRetriesAtOnceOnAnotherReplicaThenBacksOff) {
  RetryPolicy policy(/*max_attempts=*/20, /*retry_budget_ms=*/10'000);
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(policy.StartAttempt());
  policy.Failed(t0, "r0", "replica r0: connect: refused");
  EXPECT_EQ(policy.avoid(), "r0");
  EXPECT_EQ(policy.Next(t0, /*alternative=*/true, std::nullopt).kind, Kind::kRetryNow);
  ASSERT_TRUE(policy.StartAttempt());
  policy.Failed(t0, "r1", "replica r1: the stream broke");
  // The second failure of the same outage waits 100 ms, then 200, ..., at most 1 s.
  RetryPolicy::Decision d = policy.Next(t0, /*alternative=*/true, std::nullopt);
  EXPECT_EQ(d.kind, Kind::kWait);
  EXPECT_EQ(d.at, t0 + milliseconds(100));
  for (int i = 0; i < 8; ++i) d = policy.Next(t0, false, std::nullopt);
  EXPECT_EQ(d.at, t0 + milliseconds(kMaxBackoffMs));
}

TEST(RetryPolicyTest, AWaitEndsEarlyWhenAReplicaComesBackOrTheBudgetEnds) {
  RetryPolicy policy(20, /*retry_budget_ms=*/150);
  const Clock::time_point t0 = Clock::now();
  policy.NoReplica(t0, "no stage-0 replica of tiny is registered");
  RetryPolicy::Decision d = policy.Next(t0, false, t0 + milliseconds(20));
  EXPECT_EQ(d.kind, Kind::kWait);
  EXPECT_EQ(d.at, t0 + milliseconds(20));  // before the 50 ms backoff: the replica is back
  d = policy.Next(t0 + milliseconds(100), false, std::nullopt);
  EXPECT_EQ(d.at, t0 + milliseconds(150));  // the budget's end, before the 100 ms backoff's
  EXPECT_EQ(policy.Next(t0 + milliseconds(150), false, std::nullopt).kind, Kind::kGiveUp);
  EXPECT_THAT(policy.GiveUpReason(),
              HasSubstr("(150 ms of outage, 0 attempts made of 20); last: no stage-0 replica"));
}

TEST(RetryPolicyTest, ProgressStartsANewOutageWithANewBudget) {
  RetryPolicy policy(20, /*retry_budget_ms=*/1'000);
  const Clock::time_point t0 = Clock::now();
  policy.Failed(t0, "r0", "first");
  policy.Failed(t0 + milliseconds(900), "r1", "second");  // the same outage: its budget holds
  EXPECT_EQ(policy.last_error(), "second");
  EXPECT_EQ(policy.Next(t0 + milliseconds(1'000), true, std::nullopt).kind, Kind::kGiveUp);
  policy.Progress();  // tokens were delivered
  policy.Failed(t0 + milliseconds(1'000), "r0", "third");
  EXPECT_EQ(policy.Next(t0 + milliseconds(1'500), true, std::nullopt).kind, Kind::kRetryNow);
  // While an outage is under way, no replica being up keeps its first reason.
  policy.NoReplica(t0 + milliseconds(1'600), "none up");
  EXPECT_EQ(policy.last_error(), "third");
}

TEST(RetryPolicyTest, AttemptsAreBounded) {
  RetryPolicy policy(/*max_attempts=*/2, 10'000);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(policy.StartAttempt());
  EXPECT_TRUE(policy.StartAttempt());
  EXPECT_FALSE(policy.StartAttempt());
  EXPECT_EQ(policy.attempts(), 2);
  policy.Failed(t0, "r0", "broke");
  EXPECT_EQ(policy.Next(t0, true, std::nullopt).kind, Kind::kGiveUp);
  EXPECT_THAT(policy.GiveUpReason(), HasSubstr("2 attempts made of 2); last: broke"));
}

}  // namespace
}  // namespace connex::serving::internal
