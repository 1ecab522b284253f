#include "connex/pp/request_owner.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "connex/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Stage 0's engine: echoes each step's tokens as a per-token row "h" (what a later stage would
// read), says which requests it does not hold, and records what it released.
class FakeEngine final : public Engine {
 public:
  absl::StatusOr<TensorDict> ExecuteStep(const TensorDict& in) override {
    ++executions_;
    absl::StatusOr<Batch> batch = GetBatch(in);
    if (!batch.ok()) return batch.status();
    absl::StatusOr<const Tensor*> tokens = in.Get(kTokens, DType::kI32, 1);
    if (!tokens.ok()) return tokens.status();
    TensorDict out;
    SetBatch(out, batch->request_ids, batch->start_positions, batch->num_tokens);
    auto t = (*tokens)->values<int32_t>();
    out.Set("h", Tensor::Of<int32_t>({static_cast<int64_t>(t.size())}, t));
    for (uint64_t id : batch->request_ids) held_.insert(id);
    return out;
  }
  std::vector<uint64_t> MissingRequests(const TensorDict&) const override { return {}; }
  bool HoldsRequest(uint64_t id) const override { return held_.count(id) > 0; }
  void Release(uint64_t id) override {
    held_.erase(id);
    released_.push_back(id);
  }
  size_t NumHeldRequests() const override { return held_.size(); }

  int executions_ = 0;
  std::set<uint64_t> held_;
  std::vector<uint64_t> released_;
};

// The node around the owner: two replicas (r0, r1) of stages 1 and 2; the test decides which
// incarnations are live, and sees every step forwarded, signal sent, eviction and release.
class FakeHost final : public OwnerHost {
 public:
  FakeHost() {
    for (uint32_t g = 1; g <= 2; ++g) {
      for (uint32_t r = 0; r <= 1; ++r) live_.insert(Key(HopOf(g, r)));
    }
  }
  static Hop HopOf(uint32_t group, uint32_t replica, uint64_t epoch = 3) {
    return Hop{Lid{"m", group, 0, replica}, epoch, StrAddr(group, replica), {}};
  }
  static std::string StrAddr(uint32_t group, uint32_t replica) {
    return "pp+mem://g" + std::to_string(group) + "r" + std::to_string(replica);
  }
  void Kill(const Hop& h) { live_.erase(Key(h)); }

  Hop Self() const override { return Hop{Lid{"m", 0, 0, 0}, 9, "pp+mem://owner", {}}; }
  absl::StatusOr<uint64_t> Admit() override {
    if (!admit_.ok()) return admit_;
    return uint64_t{9};
  }
  void Executed(uint64_t epoch, int64_t) override { executed_epochs_.push_back(epoch); }
  bool Usable(const Lid& lid, uint64_t epoch) const override {
    return live_.count({lid, epoch}) > 0;
  }
  // Sticky: a live hop of `current` stays; else replica 0, else replica 1.
  std::optional<std::vector<Hop>> BuildRoute(const std::vector<Hop>& current) const override {
    std::vector<Hop> route;
    for (uint32_t g = 1; g <= 2; ++g) {
      if (current.size() == 2 && Usable(current[g - 1].lid, current[g - 1].epoch)) {
        route.push_back(current[g - 1]);
        continue;
      }
      std::optional<Hop> pick;
      for (uint32_t r = 0; r <= 1 && !pick; ++r) {
        if (live_.count(Key(HopOf(g, r)))) pick = HopOf(g, r);
      }
      if (!pick) return std::nullopt;
      route.push_back(*pick);
    }
    return route;
  }
  std::string RouteProblem() const override { return "stage 1: none live"; }
  void MarkFailed(const Lid& lid, uint64_t epoch) override { marked_failed_.emplace(lid, epoch); }
  uint64_t payload_capacity() const override { return 1 << 20; }
  void Forward(PendingSend send) override { forwarded_.push_back(std::move(send)); }
  void Send(const std::string& address, const Signal& signal) override {
    sent_.emplace_back(address, signal);
  }
  void Release(uint64_t id, const std::map<Lid, std::string>& visited) override {
    released_[id] = visited;
  }
  void PublishStats() override { ++published_; }

  absl::Status admit_ = absl::OkStatus();
  std::vector<uint64_t> executed_epochs_;
  std::vector<PendingSend> forwarded_;
  std::vector<std::pair<std::string, Signal>> sent_;
  std::set<std::pair<Lid, uint64_t>> marked_failed_;
  std::map<uint64_t, std::map<Lid, std::string>> released_;
  int published_ = 0;

 private:
  static std::pair<Lid, uint64_t> Key(const Hop& h) { return {h.lid, h.epoch}; }
  std::set<std::pair<Lid, uint64_t>> live_;
};

class RequestOwnerTest : public ::testing::Test {
 protected:
  RequestOwnerTest() { Make(RequestOwnerOptions{}); }

  void Make(RequestOwnerOptions o) {
    o.self = Lid{"m", 0, 0, 0};
    o.stages = 3;
    o.clock = &clock_;
    o.seed = 42;
    owner_ = std::make_unique<RequestOwner>(o, engine_, host_);
  }

  // Submits request `id` (prompt 1..prompt_len) and records its outcome and streamed tokens.
  void Submit(uint64_t id, size_t prompt_len, int max_new, StopTokens stop = {}) {
    std::vector<int32_t> prompt;
    for (size_t i = 1; i <= prompt_len; ++i) prompt.push_back(static_cast<int32_t>(i));
    ASSERT_TRUE(owner_
                    ->Add(
                        id, prompt, max_new,
                        [this](uint64_t rid, absl::StatusOr<std::vector<int32_t>> r) {
                          outcomes_.emplace(rid, std::move(r));
                        },
                        [this](uint64_t rid, int32_t t) { streamed_[rid].push_back(t); },
                        Sampling{}, 0, std::move(stop))
                    .ok());
  }

  // The last step forwarded to the route's first hop.
  const StepSignal& Last() const { return host_.forwarded_.back().signal; }

  // The RESULT of the last step forwarded, from its last hop, with `token` for each request.
  ResultSignal ResultOf(const StepSignal& s, int32_t token) const {
    return ResultSignal{s.step,
                        s.attempt,
                        s.route.back().lid,
                        s.request_ids,
                        std::vector<int32_t>(s.request_ids.size(), token),
                        s.route.back().epoch,
                        s.ticket};
  }
  MissingSignal MissingOf(const StepSignal& s, size_t hop) const {
    return MissingSignal{s.step,   s.attempt, s.route[hop].lid, s.request_ids, s.route[hop].epoch,
                         s.ticket, {}};
  }

  FakeClock clock_;
  FakeEngine engine_;
  FakeHost host_;
  std::unique_ptr<RequestOwner> owner_;
  std::map<uint64_t, absl::StatusOr<std::vector<int32_t>>> outcomes_;
  std::map<uint64_t, std::vector<int32_t>> streamed_;
};

TEST_F(RequestOwnerTest, ARequestCompletesWithItsTokensStreamedInOrderAndIsReleased) {
  Submit(1, 3, 2);
  owner_->Schedule(clock_.NowMs());
  ASSERT_EQ(host_.forwarded_.size(), 1u);
  const StepSignal first = Last();
  EXPECT_EQ(first.attempt, 1u);
  EXPECT_EQ(first.hop, 0u);
  EXPECT_THAT(first.request_ids, ElementsAre(1u));
  EXPECT_THAT(first.start_positions, ElementsAre(0));
  EXPECT_THAT(first.num_tokens, ElementsAre(3));  // the whole prompt
  ASSERT_EQ(first.route.size(), 2u);
  EXPECT_EQ(first.route[0], FakeHost::HopOf(1, 0));
  EXPECT_EQ(first.route[1], FakeHost::HopOf(2, 0));
  EXPECT_EQ(first.owner.signal, "pp+mem://owner");
  EXPECT_THAT(host_.executed_epochs_, ElementsAre(9u));
  // At most one step of a request in flight: nothing more until its result.
  owner_->Schedule(clock_.NowMs());
  EXPECT_EQ(host_.forwarded_.size(), 1u);

  owner_->OnResult(ResultOf(first, 10));
  EXPECT_THAT(streamed_[1], ElementsAre(10));
  EXPECT_TRUE(owner_->Running(1));
  owner_->Schedule(clock_.NowMs());
  ASSERT_EQ(host_.forwarded_.size(), 2u);
  const StepSignal second = Last();
  EXPECT_NE(second.step, first.step);
  EXPECT_THAT(second.start_positions, ElementsAre(3));  // decode: the one new token
  EXPECT_THAT(second.num_tokens, ElementsAre(1));

  owner_->OnResult(ResultOf(second, 11));
  ASSERT_EQ(outcomes_.count(1), 1u);
  ASSERT_TRUE(outcomes_.at(1).ok());
  EXPECT_THAT(*outcomes_.at(1), ElementsAre(10, 11));
  EXPECT_THAT(streamed_[1], ElementsAre(10, 11));
  EXPECT_FALSE(owner_->Running(1));
  EXPECT_EQ(owner_->steps(), 0u);
  EXPECT_EQ(owner_->stats().completed, 1u);
  EXPECT_THAT(engine_.released_, ElementsAre(1u));
  ASSERT_EQ(host_.released_.count(1), 1u);
  EXPECT_EQ(host_.released_.at(1).size(), 2u);  // both stages it visited
  EXPECT_GE(owner_->last_step(), second.step);
}

// The owner decides where a request ends from the tokens it accepts: at EOS unless ignore_eos,
// at any of its stop_token_ids; the stop token is the last token. Requests of one step each
// follow their own rule.
TEST_F(RequestOwnerTest, EosEndsARequestUnlessIgnoredAndStopTokenIdsEndItToo) {
  RequestOwnerOptions o;
  o.eos_token = 5;
  Make(o);
  Submit(1, 3, 8);                                            // EOS ends it
  Submit(2, 3, 8, StopTokens{/*ignore_eos=*/true, {9, 12}});  // EOS does not; 9 or 12 do
  Submit(3, 3, 3, StopTokens{/*ignore_eos=*/true, {}});       // runs to max_new
  auto step = [&](int32_t token) {
    owner_->Schedule(clock_.NowMs());
    owner_->OnResult(ResultOf(Last(), token));
  };
  step(4);
  step(5);
  ASSERT_EQ(outcomes_.count(1), 1u);
  EXPECT_THAT(*outcomes_.at(1), ElementsAre(4, 5));
  EXPECT_TRUE(owner_->Running(2));
  EXPECT_TRUE(owner_->Running(3));
  step(9);
  ASSERT_EQ(outcomes_.count(2), 1u);
  EXPECT_THAT(*outcomes_.at(2), ElementsAre(4, 5, 9));
  EXPECT_THAT(streamed_[2], ElementsAre(4, 5, 9));
  ASSERT_EQ(outcomes_.count(3), 1u);  // max_new 3 reached
  EXPECT_THAT(*outcomes_.at(3), ElementsAre(4, 5, 9));
  EXPECT_EQ(owner_->requests(), 0u);
}

// A stop string seen in request 1's token cancels request 2 of the same step from on_token, on
// the loop (StageNode::Cancel runs inline there): with 2 the last request the step waited for,
// the step ends inside the callback, and the RESULT's other tokens must not touch it.
TEST_F(RequestOwnerTest, ACallbackThatEndsTheRestOfItsStepLeavesTheResultSafe) {
  std::vector<int32_t> prompt = {1, 2, 3};
  ASSERT_TRUE(owner_
                  ->Add(
                      1, prompt, 4,
                      [this](uint64_t rid, absl::StatusOr<std::vector<int32_t>> r) {
                        outcomes_.emplace(rid, std::move(r));
                      },
                      [this](uint64_t rid, int32_t t) {
                        streamed_[rid].push_back(t);
                        owner_->Finish(2, absl::CancelledError("a stop string in request 1"));
                      },
                      Sampling{}, 0)
                  .ok());
  Submit(2, 3, 4);
  owner_->Schedule(clock_.NowMs());
  ASSERT_EQ(host_.forwarded_.size(), 1u);
  const StepSignal step = Last();
  ASSERT_THAT(step.request_ids, ElementsAre(1u, 2u));  // one step for both

  owner_->OnResult(ResultOf(step, 10));
  EXPECT_THAT(streamed_[1], ElementsAre(10));
  EXPECT_TRUE(streamed_[2].empty());  // ended before its token was delivered
  ASSERT_EQ(outcomes_.count(2), 1u);
  EXPECT_EQ(outcomes_.at(2).status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(owner_->Running(1));
  EXPECT_FALSE(owner_->Running(2));
  EXPECT_EQ(owner_->steps(), 0u);
  // Request 1 goes on alone.
  owner_->Schedule(clock_.NowMs());
  ASSERT_EQ(host_.forwarded_.size(), 2u);
  EXPECT_THAT(Last().request_ids, ElementsAre(1u));
}

TEST_F(RequestOwnerTest, AStepThroughAFailedHopIsResentToAnotherReplicaAndTheOldAttemptIsDropped) {
  Submit(1, 3, 1);
  owner_->Schedule(clock_.NowMs());
  const StepSignal first = Last();
  host_.Kill(first.route[0]);
  owner_->PeerGone(first.route[0].lid, first.route[0].epoch, "killed");
  ASSERT_EQ(host_.forwarded_.size(), 2u);
  const StepSignal resent = Last();
  EXPECT_EQ(resent.step, first.step);
  EXPECT_EQ(resent.attempt, 2u);
  EXPECT_NE(resent.ticket, first.ticket);
  EXPECT_EQ(resent.route[0], FakeHost::HopOf(1, 1));  // the other replica of stage 1
  EXPECT_EQ(resent.route[1], first.route[1]);         // sticky: the live hop stays
  EXPECT_THAT(resent.num_tokens, ElementsAre(3));     // stage 0's output, sent again
  EXPECT_EQ(owner_->stats().resends, 1u);
  EXPECT_EQ(owner_->stats().failovers, 1u);
  EXPECT_EQ(engine_.executions_, 1);  // a re-send does not run stage 0 again

  // The first attempt's answer is late: dropped, nothing streamed.
  owner_->OnResult(ResultOf(first, 7));
  EXPECT_EQ(owner_->stats().late_dropped, 1u);
  EXPECT_TRUE(streamed_[1].empty());

  owner_->OnResult(ResultOf(resent, 8));
  ASSERT_TRUE(outcomes_.at(1).ok());
  EXPECT_THAT(*outcomes_.at(1), ElementsAre(8));
  // Released on every stage it may hold state on, the replaced hop included.
  EXPECT_EQ(host_.released_.at(1).count(FakeHost::HopOf(1, 0).lid), 1u);
  EXPECT_EQ(host_.released_.at(1).count(FakeHost::HopOf(1, 1).lid), 1u);
}

TEST_F(RequestOwnerTest, AnAnswerNotFromTheStepsLastHopOrWithoutItsTicketIsNotBelieved) {
  Submit(1, 2, 1);
  owner_->Schedule(clock_.NowMs());
  const StepSignal s = Last();
  ResultSignal from_first_hop = ResultOf(s, 5);
  from_first_hop.from = s.route[0].lid;
  from_first_hop.from_epoch = s.route[0].epoch;
  owner_->OnResult(from_first_hop);
  ResultSignal wrong_ticket = ResultOf(s, 5);
  wrong_ticket.ticket ^= 2;
  owner_->OnResult(wrong_ticket);
  EXPECT_EQ(owner_->stats().forged_dropped, 2u);
  EXPECT_TRUE(owner_->Running(1));
  EXPECT_TRUE(streamed_[1].empty());
}

TEST_F(RequestOwnerTest, MissingStateReprefillsFromPositionZeroAndTheLimitAborts) {
  RequestOwnerOptions o;
  o.reprefill_max = 2;
  Make(o);
  Submit(1, 3, 4);
  owner_->Schedule(clock_.NowMs());
  owner_->OnResult(ResultOf(Last(), 20));  // one token generated: 4 tokens now
  for (int round = 1; round <= 3; ++round) {
    owner_->Schedule(clock_.NowMs());
    const StepSignal s = Last();
    if (round == 1) {
      EXPECT_THAT(s.start_positions, ElementsAre(3));  // a decode step
    } else {
      // After MISSING: prompt plus generated, from position 0.
      EXPECT_THAT(s.start_positions, ElementsAre(0));
      EXPECT_THAT(s.num_tokens, ElementsAre(4));
    }
    owner_->OnMissing(MissingOf(s, 1));
    EXPECT_EQ(owner_->stats().reprefills, static_cast<uint64_t>(round));
    EXPECT_EQ(owner_->Running(1), round <= 2) << "round " << round;
  }
  ASSERT_EQ(outcomes_.count(1), 1u);
  EXPECT_EQ(outcomes_.at(1).status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(outcomes_.at(1).status().message(),
              HasSubstr("aborted after 2 failovers (CONNEX_PP_REPREFILL_MAX=2)"));
  EXPECT_EQ(owner_->stats().aborted, 1u);
  EXPECT_EQ(owner_->steps(), 0u);
}

TEST_F(RequestOwnerTest, ACancelledRequestEndsOnceAndItsLateResultStreamsNothing) {
  Submit(1, 3, 5);
  Submit(2, 3, 5);
  owner_->Schedule(clock_.NowMs());
  ASSERT_EQ(host_.forwarded_.size(), 1u);  // one step carries both
  const StepSignal s = Last();
  EXPECT_THAT(s.request_ids, ElementsAre(1u, 2u));
  owner_->Finish(1, absl::CancelledError("client went away"));
  ASSERT_EQ(outcomes_.count(1), 1u);
  EXPECT_EQ(outcomes_.at(1).status().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(owner_->Running(1));
  EXPECT_EQ(owner_->steps(), 1u);                    // request 2 still waits for it
  owner_->Finish(1, absl::CancelledError("again"));  // not running: nothing happens
  EXPECT_EQ(owner_->stats().aborted, 1u);

  // A re-send after the cancel carries only the request still running.
  host_.Kill(s.route[1]);
  owner_->PeerGone(s.route[1].lid, s.route[1].epoch, "killed");
  ASSERT_EQ(host_.forwarded_.size(), 2u);
  const StepSignal resent = Last();
  EXPECT_THAT(resent.request_ids, ElementsAre(2u));
  EXPECT_THAT(resent.start_positions, ElementsAre(0));

  owner_->OnResult(ResultOf(s, 30));  // the first attempt's: late
  owner_->OnResult(ResultOf(resent, 31));
  EXPECT_TRUE(streamed_[1].empty());
  EXPECT_THAT(streamed_[2], ElementsAre(31));
  EXPECT_EQ(owner_->stats().late_dropped, 1u);
  EXPECT_EQ(owner_->steps(), 0u);
  EXPECT_EQ(outcomes_.count(2), 0u);  // it goes on
}

TEST_F(RequestOwnerTest, AStepTimeoutProbesTheRouteEvictsTheSilentHopAndResends) {
  RequestOwnerOptions o;
  o.step_timeout_ms = 1000;
  o.probe_timeout_ms = 100;
  Make(o);
  Submit(1, 3, 1);
  owner_->Schedule(clock_.NowMs());
  const StepSignal s = Last();
  clock_.AdvanceMs(1000);
  EXPECT_EQ(owner_->NextTimer(clock_.NowMs() + 20), clock_.NowMs());
  owner_->RunTimers(clock_.NowMs());
  ASSERT_EQ(host_.sent_.size(), 2u);  // a PING to each hop
  std::vector<PingSignal> pings;
  for (const auto& [address, signal] : host_.sent_) pings.push_back(std::get<PingSignal>(signal));
  EXPECT_EQ(host_.sent_[0].first, s.route[0].signal);
  EXPECT_EQ(pings[0].reply_to, "pp+mem://owner");
  // A PONG naming another hop than the one pinged is not believed.
  owner_->OnPong(PongSignal{pings[0].nonce, s.route[1].lid, s.route[1].epoch});
  EXPECT_EQ(owner_->stats().forged_dropped, 1u);
  owner_->OnPong(PongSignal{pings[1].nonce, s.route[1].lid, s.route[1].epoch});
  clock_.AdvanceMs(100);
  owner_->RunTimers(clock_.NowMs());
  EXPECT_EQ(host_.marked_failed_,
            (std::set<std::pair<Lid, uint64_t>>{{s.route[0].lid, s.route[0].epoch}}));
  ASSERT_EQ(host_.forwarded_.size(), 2u);  // re-sent after the probe
  EXPECT_EQ(Last().attempt, 2u);
}

TEST_F(RequestOwnerTest, ARequestPastItsDeadlineEndsWithDeadlineExceeded) {
  RequestOwnerOptions o;
  o.request_timeout_ms = 500;
  o.step_timeout_ms = 10000;
  Make(o);
  Submit(1, 3, 4);
  owner_->Schedule(clock_.NowMs());
  clock_.AdvanceMs(499);
  owner_->RunTimers(clock_.NowMs());
  EXPECT_TRUE(owner_->Running(1));
  clock_.AdvanceMs(1);
  owner_->RunTimers(clock_.NowMs());
  ASSERT_EQ(outcomes_.count(1), 1u);
  EXPECT_EQ(outcomes_.at(1).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(outcomes_.at(1).status().message(), HasSubstr("not finished within 500 ms"));
}

TEST_F(RequestOwnerTest, NoStepRunsWhileTheEpochIsNotAdmitted) {
  Submit(1, 3, 1);
  host_.admit_ = absl::UnavailableError("the directory cannot confirm the epoch");
  owner_->Schedule(clock_.NowMs());
  EXPECT_TRUE(host_.forwarded_.empty());
  EXPECT_EQ(engine_.executions_, 0);
  host_.admit_ = absl::OkStatus();
  owner_->Schedule(clock_.NowMs());
  EXPECT_EQ(host_.forwarded_.size(), 1u);
}

TEST_F(RequestOwnerTest, ARequestWithoutARouteEndsAfterTheRouteWait) {
  RequestOwnerOptions o;
  o.route_wait_ms = 1000;
  Make(o);
  host_.Kill(FakeHost::HopOf(1, 0));
  host_.Kill(FakeHost::HopOf(1, 1));
  Submit(1, 3, 1);
  owner_->Schedule(clock_.NowMs());
  EXPECT_TRUE(owner_->Running(1));
  clock_.AdvanceMs(1001);
  owner_->Schedule(clock_.NowMs());
  ASSERT_EQ(outcomes_.count(1), 1u);
  EXPECT_EQ(outcomes_.at(1).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(outcomes_.at(1).status().message(), HasSubstr("stage 1: none live"));
}

TEST_F(RequestOwnerTest, AnIdThatIsRunningIsRefused) {
  Submit(1, 3, 1);
  absl::Status again = owner_->Add(1, {1}, 1, nullptr, nullptr, Sampling{}, 0);
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace connex::pp
