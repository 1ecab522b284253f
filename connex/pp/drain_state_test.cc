#include "connex/pp/drain_state.h"

#include <chrono>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::HasSubstr;

class DrainStateTest : public ::testing::Test {
 protected:
  DrainStateTest()
      : drain_(
            "m/g0/s0/r0", &reg_,
            [this](const absl::Status& why) {
              ended_.push_back(why);
              return requests_;
            },
            [this] { return requests_; }) {
    reg_.AdvanceEpoch(7);
    drain_.OnDrained([this] { ++drained_; });
  }

  void Lose(bool left) {
    if (left) reg_.ended_by_leave.store(true);
    connex::MutexLock lock(&reg_.mu);
    reg_.lost = absl::FailedPreconditionError("superseded by epoch 9");
  }

  internal::Registration reg_;
  size_t requests_ = 3;
  std::vector<absl::Status> ended_;
  int drained_ = 0;
  DrainState drain_;
};

TEST_F(DrainStateTest, AServingNodeTakesWorkAndIsHealthy) {
  drain_.BeforeTurn();
  drain_.AfterTurn(/*idle=*/true);
  EXPECT_FALSE(drain_.draining());
  EXPECT_FALSE(drain_.lost());
  EXPECT_TRUE(drain_.health().ok());
  EXPECT_TRUE(ended_.empty());
  EXPECT_EQ(drained_, 0);
}

TEST_F(DrainStateTest, AnOperatorsDrainTakesNoNewWorkThenHandsTheRequestsOverOnceIdle) {
  reg_.operator_drain.store(true);
  drain_.BeforeTurn();
  EXPECT_TRUE(drain_.draining());
  EXPECT_EQ(drain_.health().code(), absl::StatusCode::kUnavailable);
  drain_.AfterTurn(/*idle=*/false);  // steps still in flight
  EXPECT_TRUE(ended_.empty());
  EXPECT_EQ(drained_, 0);
  drain_.AfterTurn(/*idle=*/true);
  ASSERT_EQ(ended_.size(), 1u);
  EXPECT_EQ(ended_[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(ended_[0].message(), HasSubstr("continues on another replica"));
  EXPECT_EQ(drained_, 1);
  drain_.BeforeTurn();
  drain_.AfterTurn(/*idle=*/true);
  EXPECT_EQ(ended_.size(), 1u);  // once
  EXPECT_EQ(drained_, 1);
  EXPECT_FALSE(reg_.fenced.load());  // a drain is no fence
}

TEST_F(DrainStateTest, ALostLidFencesEveryEpochAndEndsTheRequestsOnce) {
  Lose(/*left=*/false);
  drain_.BeforeTurn();
  EXPECT_TRUE(drain_.lost());
  EXPECT_TRUE(reg_.fenced.load());
  EXPECT_EQ(reg_.epoch.load(), 0u);
  ASSERT_EQ(ended_.size(), 1u);
  EXPECT_EQ(ended_[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(drain_.health().code(), absl::StatusCode::kFailedPrecondition);
  drain_.BeforeTurn();
  EXPECT_EQ(ended_.size(), 1u);
  EXPECT_FALSE(drain_.draining());
}

TEST_F(DrainStateTest, AnEpochEndedByALeaveIsADrainNotALoss) {
  Lose(/*left=*/true);  // the heartbeat saw it before the LEFT event
  drain_.BeforeTurn();
  EXPECT_FALSE(drain_.lost());
  EXPECT_FALSE(reg_.fenced.load());
  EXPECT_TRUE(reg_.operator_drain.load());
  EXPECT_TRUE(drain_.draining());
  EXPECT_TRUE(ended_.empty());
}

TEST_F(DrainStateTest, AGracefulStopWaitsForIdleOrTheStop) {
  auto drained = std::make_shared<std::promise<void>>();
  std::future<void> gate = drained->get_future();
  drain_.BeginLeave(drained);
  EXPECT_TRUE(drain_.draining());
  drain_.AfterTurn(/*idle=*/false);
  EXPECT_EQ(gate.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  drain_.AfterTurn(/*idle=*/true);
  EXPECT_EQ(gate.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_TRUE(ended_.empty());  // its own stop ends nothing here: Stop does

  auto second = std::make_shared<std::promise<void>>();
  std::future<void> stopped = second->get_future();
  drain_.BeginLeave(second);
  drain_.Stopped();
  EXPECT_EQ(stopped.wait_for(std::chrono::seconds(0)), std::future_status::ready);
}

}  // namespace
}  // namespace connex::pp
