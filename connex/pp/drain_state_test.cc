#include "connex/pp/drain_state.h"

#include <chrono>
#include <vector>

#include "connex/directory/held_lease.h"
#include "connex/pp/internal/registration.h"
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
    held_->Advance(7, /*fresh=*/true);
    drain_.OnDrained([this] { ++drained_; });
  }

  void Lose(bool left) {
    held_->Lose(absl::FailedPreconditionError("superseded by epoch 9"), left);
  }

  std::shared_ptr<directory::HeldLease> held_ =
      std::make_shared<directory::HeldLease>(Lid{"m", 0, 0, 0});
  internal::Registration reg_{held_};
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
  EXPECT_EQ(reg_.epoch(), 0u);
  ASSERT_EQ(ended_.size(), 1u);
  EXPECT_EQ(ended_[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(drain_.health().code(), absl::StatusCode::kFailedPrecondition);
  drain_.BeforeTurn();
  EXPECT_EQ(ended_.size(), 1u);
  EXPECT_FALSE(drain_.draining());
}

TEST_F(DrainStateTest, ALostLidSaysWhichAndWhy) {
  Lose(/*left=*/false);
  drain_.BeforeTurn();
  EXPECT_THAT(drain_.health().message(), HasSubstr("pp: m/g0/s0/r0 lost its LID (epoch 7)"));
  EXPECT_THAT(drain_.health().message(), HasSubstr("superseded by epoch 9"));
}

// The client saw a LEFT of the epoch held that it did not send: an operator's drain.
TEST_F(DrainStateTest, ALeaseDrainedByAnOperatorDrainsTheNode) {
  held_->Drain(6);  // an older epoch's: nothing
  drain_.BeforeTurn();
  EXPECT_FALSE(drain_.draining());
  held_->Drain(7);
  drain_.BeforeTurn();
  EXPECT_TRUE(drain_.draining());
  EXPECT_TRUE(reg_.operator_drain.load());
  EXPECT_FALSE(reg_.fenced.load());  // no fence
  EXPECT_EQ(reg_.epoch(), 7u);
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
