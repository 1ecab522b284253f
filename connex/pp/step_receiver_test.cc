// StepReceiver alone: a hand-made owner writes steps into its own ring on the mem fabric and the
// receiver (the last of two stages, a TestEngine) reads, runs, replays, fences and releases;
// the signals it sends and the outputs it delivers are recorded.
#include "connex/pp/step_receiver.h"

#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "connex/pp/send_ring.h"
#include "connex/pp/testing/fault_engine.h"
#include "connex/pp/testing/test_engine.h"
#include "connex/transport/mem/mem_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kToken = 0x5eed;

class StepReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fabric_ = transport::mem::Fabric::Create({});
    owner_transfer_ = Transfer(owner_lid_);
    stage_transfer_ = Transfer(self_);
    ring_ = *SendRing::Create(*owner_transfer_, 4, 1 << 16);
    Recreate(Options(), *stage_transfer_);
  }
  void TearDown() override { receiver_.reset(); }

  // The receiver's options: the last of two stages.
  StepReceiverOptions Options() const {
    StepReceiverOptions o;
    o.self = self_;
    o.stage = 1;
    o.stages = 2;
    o.slot_bytes = 1 << 16;
    return o;
  }
  // As Options, with reads that may lose the loop (`blocking`): the rest of such a step is
  // posted to loop_, which the test runs.
  StepReceiverOptions LoopOptions(std::function<bool(const std::function<void()>&)> blocking) {
    StepReceiverOptions o = Options();
    o.handoff.blocking = std::move(blocking);
    o.handoff.post = [this](std::function<void()> run, std::function<void()>) {
      loop_.push_back(std::move(run));
      return true;
    };
    return o;
  }
  // The receiver under test, made anew with `o`, reading through `transfer`.
  void Recreate(StepReceiverOptions o, transport::TransferEngine& transfer) {
    receiver_.reset();
    auto r = StepReceiver::Create(
        std::move(o), engine_, transfer, [this] { return epoch_; },
        [this](const std::string& address, const Signal& s) { sent_.emplace_back(address, s); },
        [this](const StepSignal& s, const TensorDict&) { delivered_.push_back(s.step); });
    ASSERT_TRUE(r.ok()) << r.status();
    receiver_ = *std::move(r);
  }

  transport::TransferEnginePtr Transfer(const Lid& lid) {
    transport::TransportOptions t;
    t.backend = transport::Backend::kMem;
    t.local_lid = lid;
    t.fabric = fabric_;
    return *transport::CreateTransferEngine(t);
  }

  // Step `step` (attempt `attempt`) of request `id` at `start` with `n` tokens, from the owner
  // incarnation `owner_epoch`, in a fresh slot of the owner's ring.
  StepSignal Step(uint64_t step, uint32_t attempt, uint64_t id, int32_t start, int32_t n,
                  uint64_t owner_epoch = 1) {
    return StepFrom(owner_lid_, *owner_transfer_, *ring_, step, attempt, id, start, n, owner_epoch);
  }
  // As Step, from the owner `lid` with its own transfer engine and ring.
  StepSignal StepFrom(const Lid& lid, transport::TransferEngine& transfer, SendRing& ring,
                      uint64_t step, uint32_t attempt, uint64_t id, int32_t start, int32_t n,
                      uint64_t owner_epoch = 1, bool read_at_once = true) {
    TensorDict d;
    SetBatch(d, {id}, {start}, {n});
    d.Set("hidden", Tensor::Of<int64_t>({n}, std::vector<int64_t>(static_cast<size_t>(n), 42)));
    const uint64_t corr = next_corr_++;
    uint32_t slot = *ring.Acquire(corr);
    StepSignal s;
    s.layout = Pack(d, ring.payload(slot));
    s.length = PackedSize(d);
    ring.Seal(slot, corr, s.length);
    // Read at once (most tests): the slot may be reused after.
    if (read_at_once) ring.Release(corr);
    s.corr = corr;
    s.step = step;
    s.attempt = attempt;
    s.ticket = 1000 + step * 10 + attempt;
    s.owner = Hop{lid, owner_epoch, "pp+mem://" + lid.ToString(), transfer.LocalAddresses()};
    s.owner_token = kToken;
    s.origin = s.owner;
    s.route = {Hop{self_, epoch_, "pp+mem://stage", stage_transfer_->LocalAddresses()}};
    s.hop = 0;
    s.request_ids = {id};
    s.start_positions = {start};
    s.num_tokens = {n};
    s.remote_addr = ring.remote_addr(slot);
    return s;
  }

  template <typename T>
  std::vector<T> Sent() const {
    std::vector<T> out;
    for (const auto& [address, s] : sent_) {
      if (auto* t = std::get_if<T>(&s)) out.push_back(*t);
    }
    return out;
  }

  const Lid owner_lid_{"m", 0, 0, 0};
  const Lid self_{"m", 1, 0, 0};
  uint64_t epoch_ = 7;
  uint64_t next_corr_ = 1;
  std::shared_ptr<transport::mem::Fabric> fabric_;
  transport::TransferEnginePtr owner_transfer_;
  transport::TransferEnginePtr stage_transfer_;
  std::unique_ptr<SendRing> ring_;
  testing::TestEngine engine_{1, 2};
  std::unique_ptr<StepReceiver> receiver_;
  std::vector<std::pair<std::string, Signal>> sent_;
  std::vector<uint64_t> delivered_;
  std::deque<std::function<void()>> loop_;  // what the receiver posted for its loop
};

TEST_F(StepReceiverTest, AStepRunsOnceAndAResentAttemptIsAnsweredFromTheCache) {
  receiver_->OnStep(Step(10, 1, 5, 0, 3));
  receiver_->OnStep(Step(10, 2, 5, 0, 3));
  EXPECT_THAT(delivered_, ElementsAre(10u, 10u));
  EXPECT_EQ(engine_.executions(), 1u);
  EXPECT_EQ(receiver_->stats().steps_replayed, 1u);
  EXPECT_EQ(Sent<AckSignal>().size(), 2u);
  EXPECT_TRUE(Sent<MissingSignal>().empty());
}

// Found by the campaign's directory restarts (seed 15): a directory that lost its state made
// every stage see a live owner FAIL; the owner joined again under a new epoch and re-sent the
// step whose result had been lost. The step was in the replay cache but its request's state was
// gone: the receiver answered nothing, and the owner re-sent it 32 times, then gave up.
TEST_F(StepReceiverTest, AResentStepWhoseStateWentSinceIsReportedMissing) {
  receiver_->OnStep(Step(10, 1, 5, 0, 3, /*owner_epoch=*/1));
  ASSERT_THAT(delivered_, ElementsAre(10u));
  receiver_->OwnerFailed(owner_lid_, 1);
  EXPECT_EQ(engine_.held_requests(), 0u);
  receiver_->OnStep(Step(10, 2, 5, 0, 3, /*owner_epoch=*/2));  // the same process, rejoined
  std::vector<MissingSignal> missing = Sent<MissingSignal>();
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_THAT(missing[0].request_ids, ElementsAre(5u));
  EXPECT_EQ(missing[0].step, 10u);
  EXPECT_EQ(missing[0].attempt, 2u);
  EXPECT_EQ(missing[0].from_epoch, epoch_);
  EXPECT_THAT(delivered_, ElementsAre(10u));  // nothing replayed, nothing run again
  EXPECT_EQ(engine_.executions(), 1u);
  // The owner recomputes from position 0: that runs, and is held again.
  receiver_->OnStep(Step(11, 1, 5, 0, 3, /*owner_epoch=*/2));
  EXPECT_THAT(delivered_, ElementsAre(10u, 11u));
  EXPECT_EQ(engine_.held_requests(), 1u);
  EXPECT_THAT(engine_.violations(), ::testing::IsEmpty());
}

TEST_F(StepReceiverTest, AStepOfAFailedOwnerIncarnationIsRefused) {
  receiver_->OnStep(Step(10, 1, 5, 0, 3, /*owner_epoch=*/1));
  receiver_->OwnerFailed(owner_lid_, 1);
  receiver_->OnStep(Step(11, 1, 5, 3, 1, /*owner_epoch=*/1));
  std::vector<AckSignal> acks = Sent<AckSignal>();
  ASSERT_EQ(acks.size(), 2u);
  EXPECT_EQ(acks[1].code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(acks[1].message, HasSubstr("is gone"));
  EXPECT_EQ(engine_.executions(), 1u);
  EXPECT_EQ(receiver_->stats().fenced, 1u);
}

// Found by the 1000-seed campaign (seed 33): a directory that lost its state twice made a live
// owner join again under new epochs; it died before sending this stage a step under the last one,
// whose FAILED then matched none of the state the stage held for it (last seen at an earlier
// epoch), and that state stayed for ever.
TEST_F(StepReceiverTest, AnOwnersFailureDropsTheStateItLeftUnderEarlierEpochs) {
  receiver_->OnStep(Step(10, 1, 5, 0, 3, /*owner_epoch=*/1));
  receiver_->OnStep(Step(11, 1, 6, 0, 2, /*owner_epoch=*/2));
  ASSERT_EQ(engine_.held_requests(), 2u);
  receiver_->OwnerFailed(owner_lid_, 3);
  EXPECT_EQ(engine_.held_requests(), 0u);
  EXPECT_EQ(receiver_->held_requests(), 0u);
  // A late step of one of those incarnations does not make state again.
  receiver_->OnStep(Step(12, 1, 7, 0, 1, /*owner_epoch=*/2));
  EXPECT_EQ(engine_.held_requests(), 0u);
  EXPECT_THAT(Sent<AckSignal>().back().message, HasSubstr("is gone"));
}

// Issue 23 (seed 33, the cause): a watcher's catch-up after a lost snapshot reported only the
// epoch it had seen as FAILED (1); the owner's intermediate incarnation (2) had left state here,
// which that FAILED keeps (it is later). The owner's JOINED under epoch 3 drops every earlier one.
TEST_F(StepReceiverTest, AnOwnersJoinDropsTheStateOfEveryEarlierIncarnation) {
  receiver_->OnStep(Step(10, 1, 5, 0, 3, /*owner_epoch=*/1));
  receiver_->OnStep(Step(11, 1, 6, 0, 2, /*owner_epoch=*/2));
  ASSERT_EQ(engine_.held_requests(), 2u);
  receiver_->OwnerFailed(owner_lid_, 1);  // all the catch-up said: the owner was last seen at 2
  EXPECT_EQ(engine_.held_requests(), 2u);
  receiver_->OwnerJoined(owner_lid_, 3);
  EXPECT_EQ(engine_.held_requests(), 0u);
  EXPECT_EQ(receiver_->held_requests(), 0u);
  // The new incarnation's steps run.
  receiver_->OnStep(Step(12, 1, 7, 0, 1, /*owner_epoch=*/3));
  EXPECT_EQ(engine_.held_requests(), 1u);
}

TEST_F(StepReceiverTest, AnOwnersFailureKeepsTheStateOfALaterIncarnation) {
  receiver_->OnStep(Step(10, 1, 5, 0, 3, /*owner_epoch=*/4));
  receiver_->OwnerFailed(owner_lid_, 3);  // a late FAILED of an earlier epoch
  EXPECT_EQ(engine_.held_requests(), 1u);
}

TEST_F(StepReceiverTest, AStepForAnotherEpochOfThisStageIsRefused) {
  StepSignal s = Step(10, 1, 5, 0, 3);
  s.route[0].epoch = epoch_ - 1;
  receiver_->OnStep(s);
  std::vector<AckSignal> acks = Sent<AckSignal>();
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(engine_.executions(), 0u);
}

TEST_F(StepReceiverTest, ALeftOwnersStateGoesWhenItsGraceRunsOut) {
  receiver_->OnStep(Step(10, 1, 5, 0, 3));
  receiver_->OwnerLeft(owner_lid_, 1, /*drop_at_ms=*/5000);
  receiver_->Tick(4999);
  EXPECT_EQ(engine_.held_requests(), 1u);
  receiver_->Tick(5000);
  EXPECT_EQ(engine_.held_requests(), 0u);
  EXPECT_EQ(receiver_->held_requests(), 0u);
}

TEST_F(StepReceiverTest, OnlyTheOwnersTokenReleasesAndARelasedRequestsLateStepDoesNotRun) {
  receiver_->OnStep(Step(10, 1, 5, 0, 3));
  receiver_->OnRelease(ReleaseSignal{owner_lid_, {5}, kToken + 1, 1, "pp+mem://owner", 10});
  EXPECT_EQ(engine_.held_requests(), 1u);  // a stranger's RELEASE changes nothing
  receiver_->OnRelease(ReleaseSignal{owner_lid_, {5}, kToken, 2, "pp+mem://owner", 12});
  EXPECT_EQ(engine_.held_requests(), 0u);
  EXPECT_EQ(Sent<ReleasedSignal>().size(), 2u);  // both answered; only one believed
  receiver_->OnStep(Step(12, 1, 5, 0, 3));       // a late step the release covers
  EXPECT_EQ(engine_.executions(), 1u);
  EXPECT_EQ(engine_.held_requests(), 0u);
  EXPECT_TRUE(Sent<MissingSignal>().empty());
}

TEST(LastStageAnswerTest, ResultsWithTheTokensOrAStepErrorWithoutThem) {
  StepSignal s;
  s.step = 8;
  s.attempt = 2;
  s.ticket = 77;
  const Lid self{"m", 2, 0, 0};
  TensorDict out;
  SetBatch(out, {5, 6}, {0, 0}, {1, 1});
  absl::StatusOr<Signal> error = LastStageAnswer(s, out, self, 9);
  ASSERT_TRUE(error.ok());
  const auto& e = std::get<StepErrorSignal>(*error);
  EXPECT_THAT(e.request_ids, ElementsAre(5u, 6u));
  EXPECT_EQ(e.code, static_cast<uint32_t>(absl::StatusCode::kInternal));
  EXPECT_EQ(e.ticket, 77u);
  out.Set(kNextTokens, Tensor::Of<int32_t>({2}, std::vector<int32_t>{40, 41}));
  absl::StatusOr<Signal> result = LastStageAnswer(s, out, self, 9);
  ASSERT_TRUE(result.ok());
  const auto& r = std::get<ResultSignal>(*result);
  EXPECT_EQ(r.step, 8u);
  EXPECT_EQ(r.attempt, 2u);
  EXPECT_EQ(r.from, self);
  EXPECT_EQ(r.from_epoch, 9u);
  EXPECT_THAT(r.tokens, ElementsAre(40, 41));
  EXPECT_FALSE(LastStageAnswer(s, TensorDict{}, self, 9).ok());  // no batch: nothing to say
}

// A read that hung long enough for the node's follower thread to take the loop over
// (options.blocking answers false, internal/loop_baton.h): the thread that read hands the rest of
// the step to the loop (options.post), and touches nothing else. Meanwhile the loop serves the
// other origins, and a duplicate of the hung step's signal is acknowledged only once it was read
// (its slot is the sender's until then).
TEST_F(StepReceiverTest, AReadThatLostTheLoopEndsOnTheLoop) {
  bool take_over = false;  // whether the next read "hangs" past the take-over
  Recreate(LoopOptions([&](const std::function<void()>& read) {
             read();
             return !std::exchange(take_over, false);
           }),
           *stage_transfer_);
  std::deque<std::function<void()>>& loop = loop_;
  const Lid b_lid{"m", 0, 1, 0};
  transport::TransferEnginePtr b_transfer = Transfer(b_lid);
  std::unique_ptr<SendRing> b_ring = *SendRing::Create(*b_transfer, 4, 1 << 16);

  take_over = true;
  const StepSignal hung =
      StepFrom(owner_lid_, *owner_transfer_, *ring_, 10, 1, 5, 0, 3, 1, /*read_at_once=*/false);
  receiver_->OnStep(hung);
  ASSERT_EQ(loop.size(), 1u);  // the rest of the step waits for the loop
  EXPECT_TRUE(delivered_.empty());
  EXPECT_EQ(receiver_->reading(), 1u);
  receiver_->OnStep(hung);  // its owner re-sent the signal: no ACK while the slot is not read
  EXPECT_TRUE(Sent<AckSignal>().empty());
  // The loop goes on with another origin's steps meanwhile, in a second buffer.
  receiver_->OnStep(StepFrom(b_lid, *b_transfer, *b_ring, 20, 1, 6, 0, 3));
  receiver_->OnStep(StepFrom(b_lid, *b_transfer, *b_ring, 21, 1, 6, 3, 1));
  EXPECT_THAT(delivered_, ElementsAre(20u, 21u));
  ASSERT_EQ(Sent<AckSignal>().size(), 2u);
  // Then the hung read's rest: it runs, and both of its signals are acknowledged.
  std::function<void()> rest = std::move(loop.front());
  loop.pop_front();
  rest();
  EXPECT_THAT(delivered_, ElementsAre(20u, 21u, 10u));
  EXPECT_EQ(receiver_->reading(), 0u);
  std::vector<AckSignal> acks = Sent<AckSignal>();
  ASSERT_EQ(acks.size(), 4u);
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_EQ(acks[i].corr, hung.corr);
    EXPECT_EQ(acks[i].code, 0u) << acks[i].message;
  }
  EXPECT_EQ(engine_.executions(), 3u);
  EXPECT_THAT(engine_.violations(), ::testing::IsEmpty());
}

// A read that failed while another thread took the loop: the rest answers with the read's error.
TEST_F(StepReceiverTest, AHungReadThatFailedIsAnsweredWithItsError) {
  auto faulty = std::make_shared<testing::FaultInjectingTransferEngine>(Transfer(self_));
  Recreate(LoopOptions([&](const std::function<void()>& read) {
             std::thread peer_gone([&] {
               while (faulty->held_reads() == 0) std::this_thread::yield();
               faulty->ReleaseHeldReads();  // as the transport does once it suspects the peer
             });
             read();
             peer_gone.join();
             return false;
           }),
           *faulty);
  std::deque<std::function<void()>>& loop = loop_;
  faulty->HoldReadsFrom(owner_lid_);
  const StepSignal s = Step(10, 1, 5, 0, 3);
  receiver_->OnStep(s);
  ASSERT_EQ(loop.size(), 1u);
  loop.front()();
  std::vector<AckSignal> acks = Sent<AckSignal>();
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].corr, s.corr);
  EXPECT_EQ(acks[0].code, static_cast<uint32_t>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(acks[0].message, HasSubstr("stopped answering"));
  EXPECT_TRUE(delivered_.empty());
  EXPECT_EQ(engine_.executions(), 0u);
  receiver_.reset();  // before the transfer engine it reads with
}

}  // namespace
}  // namespace connex::pp
