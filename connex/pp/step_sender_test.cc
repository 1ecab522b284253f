#include "connex/pp/step_sender.h"

#include <vector>

#include "connex/pp/engine.h"
#include "connex/transport/mem/mem_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class StepSenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fabric_ = transport::mem::Fabric::Create({});
    transport::TransportOptions t;
    t.backend = transport::Backend::kMem;
    t.local_lid = self_;
    t.fabric = fabric_;
    engine_ = *transport::CreateTransferEngine(t);
    StepSenderOptions o;
    o.self = self_;
    o.ack_timeout_ms = 1000;
    o.clock = &clock_;
    sender_ = std::make_unique<StepSender>(
        o, *SendRing::Create(*engine_, 2, 4096),
        [this](const std::string& address, const Signal& s) {
          sent_.emplace_back(address, std::get<StepSignal>(s));
        },
        [this](const SendFailure& f) { failures_.push_back(f); });
  }
  void TearDown() override { sender_.reset(); }

  // A step for `id` to `target_`, with `bytes` of payload.
  PendingSend Step(uint64_t step, size_t bytes = 64) {
    PendingSend p;
    p.signal.step = step;
    p.signal.attempt = 1;
    p.signal.ticket = 40 + step;
    p.signal.owner = Hop{self_, 1, "pp+mem://owner", {}};
    p.signal.origin = p.signal.owner;
    p.signal.route = {target_};
    p.signal.hop = 0;
    SetBatch(p.payload, {step}, {0}, {1});
    p.payload.Set("h", Tensor::Of<int32_t>({static_cast<int64_t>(bytes / 4)},
                                           std::vector<int32_t>(bytes / 4, 7)));
    return p;
  }
  AckSignal Ack(size_t i, uint32_t code = 0) {
    return AckSignal{sent_.at(i).second.corr, target_.lid, code, code ? "refused" : ""};
  }

  FakeClock clock_;
  const Lid self_{"m", 0, 0, 0};
  const Hop target_{Lid{"m", 1, 0, 0}, 5, "pp+mem://1", {}};
  std::shared_ptr<transport::mem::Fabric> fabric_;
  transport::TransferEnginePtr engine_;
  std::unique_ptr<StepSender> sender_;
  std::vector<std::pair<std::string, StepSignal>> sent_;
  std::vector<SendFailure> failures_;
};

TEST_F(StepSenderTest, AFullRingQueuesInOrderAndAnAckFreesASlot) {
  for (uint64_t s = 1; s <= 3; ++s) sender_->Forward(Step(s));
  ASSERT_EQ(sent_.size(), 2u);  // two slots
  EXPECT_EQ(sender_->queued(), 1u);
  EXPECT_EQ(sender_->backpressured(), 1u);
  EXPECT_EQ(sent_[0].first, "pp+mem://1");
  EXPECT_NE(sent_[0].second.corr, sent_[1].second.corr);
  EXPECT_TRUE(sender_->OnAck(Ack(0)));
  sender_->Flush();
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[2].second.step, 3u);
  EXPECT_EQ(sender_->slots_in_use(), 2u);
  EXPECT_TRUE(failures_.empty());
}

TEST_F(StepSenderTest, AnAckFromAnotherLidIsNotBelievedAndADuplicateChangesNothing) {
  sender_->Forward(Step(1));
  AckSignal forged = Ack(0);
  forged.from = Lid{"m", 1, 0, 7};
  EXPECT_FALSE(sender_->OnAck(forged));
  EXPECT_EQ(sender_->slots_in_use(), 1u);
  EXPECT_TRUE(sender_->OnAck(Ack(0)));
  EXPECT_TRUE(sender_->OnAck(Ack(0)));  // again: unknown now
  EXPECT_EQ(sender_->slots_in_use(), 0u);
}

TEST_F(StepSenderTest, ARefusalTimeoutOrDeathFailsTheSendOnce) {
  sender_->Forward(Step(1));
  sender_->Forward(Step(2));
  ASSERT_TRUE(sender_->OnAck(Ack(0, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition))));
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].step, 1u);
  EXPECT_EQ(failures_[0].ticket, 41u);
  EXPECT_EQ(failures_[0].code, absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(failures_[0].owner.signal, "pp+mem://owner");
  clock_.AdvanceMs(999);
  sender_->Expire(clock_.NowMs());
  EXPECT_EQ(failures_.size(), 1u);
  clock_.AdvanceMs(1);
  sender_->Expire(clock_.NowMs());
  ASSERT_EQ(failures_.size(), 2u);
  EXPECT_EQ(failures_[1].code, absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(sender_->slots_in_use(), 0u);
  sender_->Forward(Step(3));
  sender_->PeerGone(target_.lid, "transport: closed");
  ASSERT_EQ(failures_.size(), 3u);
  EXPECT_EQ(failures_[2].code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(failures_[2].reason, "transport: closed");
  EXPECT_EQ(sender_->slots_in_use(), 0u);
}

// Issue 9 finding 1: a payload larger than a slot was re-sent for ever; it is a permanent error
// that takes no slot.
TEST_F(StepSenderTest, APayloadLargerThanASlotFailsAtOnce) {
  sender_->Forward(Step(1, 8000));
  EXPECT_TRUE(sent_.empty());
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].code, absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(failures_[0].reason, HasSubstr("CONNEX_PP_SLOT_BYTES"));
  EXPECT_EQ(sender_->slots_in_use(), 0u);
  EXPECT_EQ(sender_->queued(), 0u);
}

TEST(NextHopTest, MovesTheStepOneHopOnWithTheRequestsThatRanHere) {
  StepSignal s;
  s.step = 4;
  s.hop = 0;
  s.route = {Hop{Lid{"m", 1, 0, 0}, 2, "pp+mem://1", {}},
             Hop{Lid{"m", 2, 0, 0}, 3, "pp+mem://2", {}}};
  s.request_ids = {1, 2};
  s.start_positions = {0, 0};
  s.num_tokens = {3, 3};
  TensorDict out;
  SetBatch(out, {2}, {0}, {3});  // request 1 was reported missing here
  const Hop self = s.route[0];
  absl::StatusOr<PendingSend> next = NextHop(s, out, self);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->signal.hop, 1u);
  EXPECT_EQ(next->signal.target(), s.route[1]);
  EXPECT_EQ(next->signal.origin, self);
  EXPECT_THAT(next->signal.request_ids, ElementsAre(2u));
  EXPECT_THAT(next->signal.num_tokens, ElementsAre(3));
  // The last hop has none after it; an output without a batch cannot go on.
  s.hop = 1;
  EXPECT_THAT(NextHop(s, out, self).status().message(), HasSubstr("step 4 has no hop after 1"));
  s.hop = 0;
  EXPECT_EQ(NextHop(s, TensorDict{}, self).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace connex::pp
