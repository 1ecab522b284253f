// The step protocol over the mem transport and mem signals, with a real directory: targeted tests
// of each rule.
#include "connex/pp/node.h"

#include <atomic>

#include "connex/base/wait.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/pp/messages.h"
#include "connex/pp/send_ring.h"
#include "connex/pp/testing/cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using testing::Cluster;
using ::testing::HasSubstr;
using testing::Outcome;
using testing::ReferenceTokens;

std::unique_ptr<directory::DirectoryServer> StartDirectory() {
  return *directory::testing::StartTestDirectory();
}

StageNodeOptions FastOptions() { return testing::FastTestOptions(); }

std::vector<int32_t> Prompt(uint64_t id) {
  std::vector<int32_t> p;
  for (uint64_t i = 0; i < 3 + id % 5; ++i)
    p.push_back(static_cast<int32_t>((id * 31 + i * 7) % 200));
  return p;
}

class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override { server_ = StartDirectory(); }

  std::unique_ptr<Cluster> MakeCluster(uint32_t stages, uint32_t replicas,
                                       StageNodeOptions o = FastOptions()) {
    static int counter = 0;
    auto c = std::make_unique<Cluster>(*server_, "m" + std::to_string(++counter), stages, 7, o);
    for (uint32_t r = 0; r < replicas; ++r) {
      for (uint32_t s = 0; s < stages; ++s) EXPECT_NE(c->Start(s, r), nullptr);
    }
    // Owners route only through stages they can see.
    auto watcher = directory::testing::ConnectTo(*server_);
    (*watcher)->Watch(c->model()).IgnoreError();
    EXPECT_TRUE((*watcher)->AwaitView(
        c->model(), [&](const auto& v) { return v.size() == stages * replicas; }, 5000));
    return c;
  }

  // Every request finished with exactly the tokens of an undisturbed run (all generated
  // `max_new` tokens, except those listed in `other_max`).
  void ExpectAllMatchReference(const Cluster& c, int max_new,
                               std::map<uint64_t, int> other_max = {}) {
    for (const auto& [id, o] : c.outcomes()) {
      ASSERT_TRUE(o.done) << "request " << id;
      ASSERT_TRUE(o.tokens.ok()) << "request " << id << ": " << o.tokens.status();
      int n = other_max.count(id) ? other_max[id] : max_new;
      EXPECT_EQ(*o.tokens, ReferenceTokens(c.stages(), Prompt(id), n)) << "request " << id;
      // Streamed once each, in order, before the completion — failovers included.
      EXPECT_EQ(o.streamed, *o.tokens) << "request " << id;
      EXPECT_FALSE(o.streamed_after_done) << "request " << id;
    }
    EXPECT_THAT(c.violations(), ::testing::IsEmpty());
  }

  std::unique_ptr<directory::DirectoryServer> server_;
};

TEST_F(NodeTest, SingleChainMatchesTheReference) {
  auto c = MakeCluster(3, 1);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 12).ok());
  ASSERT_TRUE(c->AwaitAll(20000));
  ExpectAllMatchReference(*c, 12);
  EXPECT_TRUE(c->AwaitRingsEmpty(5000));
  StageNodeStats s = c->TotalStats();
  EXPECT_EQ(s.completed, 6u);
  EXPECT_EQ(s.reprefills, 0u);
  EXPECT_EQ(s.steps_replayed, 0u);
}

TEST_F(NodeTest, OneStagePipelineNeedsNoPeers) {
  auto c = MakeCluster(1, 1);
  ASSERT_TRUE(c->Submit(0, 1, Prompt(1), 5).ok());
  ASSERT_TRUE(c->AwaitAll(5000));
  ExpectAllMatchReference(*c, 5);
}

TEST_F(NodeTest, KilledStageFailsOverToAnotherReplica) {
  auto c = MakeCluster(3, 2);
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 300).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().steps_executed > 30; }, 10000));
  c->Kill(1, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 300);
  StageNodeStats s = c->TotalStats();
  EXPECT_GT(s.failovers, 0u);
  EXPECT_GT(s.reprefills, 0u);  // replica 1's stage 1 did not hold their state
  EXPECT_GT(c->engine(1, 1)->executions(), 0u);
  EXPECT_TRUE(c->AwaitRingsEmpty(5000));
}

// A client that went away: the request ends at once with its reason, streams nothing more, and
// no stage holds its state afterwards.
TEST_F(NodeTest, ACancelledRequestEndsAtOnceAndNoStageHoldsItsState) {
  auto c = MakeCluster(3, 1);
  ASSERT_TRUE(c->Submit(0, 1, Prompt(1), 100000).ok());
  ASSERT_TRUE(c->Submit(0, 2, Prompt(2), 20).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->outcomes()[1].streamed.size() >= 5; }, 10000));
  ASSERT_TRUE(c->node(0, 0)->Cancel(1, absl::CancelledError("the client went away")).ok());
  Outcome one = c->outcomes()[1];
  ASSERT_TRUE(one.done);
  EXPECT_EQ(one.tokens.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(one.tokens.status().message(), HasSubstr("the client went away"));
  EXPECT_EQ(c->node(0, 0)->Cancel(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->node(1, 0)->Cancel(2).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->AwaitAll(20000));
  EXPECT_TRUE(c->outcomes()[2].tokens.ok());  // the other request is untouched
  EXPECT_EQ(c->outcomes()[1].streamed.size(), one.streamed.size());
  EXPECT_FALSE(c->outcomes()[1].streamed_after_done);
  EXPECT_TRUE(c->AwaitNoStateHeld(10000)) << c->StateHeld();
  EXPECT_TRUE(c->AwaitRingsEmpty(5000));
}

// A stop string seen in the token stream: the callback cancels its own request, on the node's
// loop, and gets exactly the tokens it saw.
TEST_F(NodeTest, ARequestCanBeCancelledFromItsOwnTokenCallback) {
  auto c = MakeCluster(2, 1);
  std::vector<int32_t> seen;
  absl::StatusOr<std::vector<int32_t>> result = absl::UnknownError("not done");
  std::atomic<bool> done{false};
  StageNode* owner = c->node(0, 0);
  SubmitOptions options;
  options.on_token = [&](uint64_t id, int32_t token) {
    seen.push_back(token);
    if (seen.size() == 5) {
      EXPECT_TRUE(owner->Cancel(id, absl::CancelledError("stop")).ok());
    }
  };
  ASSERT_TRUE(owner
                  ->Submit(
                      9, Prompt(9), 1000,
                      [&](uint64_t, absl::StatusOr<std::vector<int32_t>> r) {
                        result = std::move(r);
                        done.store(true);
                      },
                      std::move(options))
                  .ok());
  ASSERT_TRUE(WaitUntil([&] { return done.load(); }, 10000));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen, std::vector<int32_t>(ReferenceTokens(2, Prompt(9), 5)));
  EXPECT_TRUE(c->AwaitNoStateHeld(10000)) << c->StateHeld();
}

TEST_F(NodeTest, ASamplingOutOfRangeIsRefusedNamingTheField) {
  auto c = MakeCluster(2, 1);
  SubmitOptions options;
  options.sampling.temperature = 5;
  absl::Status s = c->node(0, 0)->Submit(
      1, Prompt(1), 5, [](uint64_t, absl::StatusOr<std::vector<int32_t>>) {}, std::move(options));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("temperature 5"));
}

TEST_F(NodeTest, AbortsAfterTheReprefillLimit) {
  StageNodeOptions o = FastOptions();
  o.reprefill_max = 2;
  auto c = MakeCluster(2, 1, o);
  c->engine(1, 0)->SetAmnesiac(true);  // loses every request's state after its prefill
  ASSERT_TRUE(c->Submit(0, 1, Prompt(1), 10).ok());
  ASSERT_TRUE(c->AwaitAll(10000));
  auto outcome = c->outcomes()[1];
  ASSERT_FALSE(outcome.tokens.ok());
  EXPECT_EQ(outcome.tokens.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(outcome.tokens.status().message()), HasSubstr("after 2 failovers"));
  EXPECT_EQ(c->TotalStats().reprefills, 3u);
}

TEST_F(NodeTest, DroppedDelayedAndDuplicatedSignalsChangeNothing) {
  auto c = MakeCluster(3, 1);
  c->signals().SetFaults(SignalFaults{0.05, 0.2, 0.2, 40});
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 15).ok());
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 15);
  StageNodeStats s = c->TotalStats();
  EXPECT_GT(s.duplicates_dropped + s.late_dropped + s.steps_replayed, 0u);
  c->signals().SetFaults({});
  EXPECT_TRUE(c->AwaitRingsEmpty(5000));
}

TEST_F(NodeTest, BackpressureNeverOverwritesASlot) {
  StageNodeOptions o = FastOptions();
  o.ring_slots = 1;
  o.inflight = 4;
  o.max_batch = 1;
  auto c = MakeCluster(3, 1, o);
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 8).ok());
  ASSERT_TRUE(c->AwaitAll(20000));
  ExpectAllMatchReference(*c, 8);
  EXPECT_GT(c->TotalStats().backpressured, 0u);
}

TEST_F(NodeTest, GracefulLeaveDrainsWithoutLosingSteps) {
  auto c = MakeCluster(3, 2);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 300).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().steps_executed > 20; }, 10000));
  c->Leave(2, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 300);
  EXPECT_GT(c->engine(2, 1)->executions(), 0u);
}

TEST_F(NodeTest, RejoinedStageTakesTrafficAgain) {
  auto c = MakeCluster(2, 1);
  ASSERT_TRUE(c->Submit(0, 1, Prompt(1), 5).ok());
  ASSERT_TRUE(c->AwaitAll(10000));
  c->Kill(1, 0);
  ASSERT_NE(c->Start(1, 0), nullptr);  // same LID, new process, new epoch
  ASSERT_TRUE(c->Submit(0, 2, Prompt(2), 20).ok());
  ASSERT_TRUE(c->AwaitAll(20000));
  ExpectAllMatchReference(*c, 20, {{1, 5}});
  EXPECT_GT(c->engine(1, 0)->executions(), 0u);
}

TEST_F(NodeTest, MigratedStageIsReachedWithoutRecompute) {
  auto c = MakeCluster(3, 1);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 300).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().steps_executed > 20; }, 10000));
  uint64_t before = c->node(1, 0)->epoch();
  ASSERT_TRUE(c->Migrate(1, 0).ok());
  EXPECT_GT(c->node(1, 0)->epoch(), before);
  uint64_t executed_before = c->engine(1, 0)->executions();
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 300);
  EXPECT_GT(c->engine(1, 0)->executions(), executed_before);  // reached at its new address
  EXPECT_EQ(c->TotalStats().reprefills, 0u);                  // the state moved with the endpoint
}

}  // namespace
}  // namespace connex::pp

namespace connex::pp {
namespace {

// A hand-driven stage 0: it packs payloads into its own ring and sends crafted signals to the
// last stage of a two-stage pipeline, then reads what comes back.
class RawOwner {
 public:
  explicit RawOwner(Cluster& c) : lid_{c.model(), 0, 0, 9} {
    transport::TransportOptions t;
    t.backend = transport::Backend::kMem;
    t.local_lid = lid_;
    t.fabric = std::shared_ptr<transport::mem::Fabric>(&c.fabric(), [](auto*) {});
    transfer_ = *transport::CreateTransferEngine(t);
    ring_ = *SendRing::Create(*transfer_, 4, 1 << 16);
    endpoint_ = c.signals().NewEndpoint();
    endpoint_->SetReceiver([this](std::string frame) {
      connex::MutexLock lock(&mu_);
      inbox_.push_back(*Decode(frame));
    });
  }

  Hop Me() const { return Hop{lid_, epoch_, endpoint_->address(), transfer_->LocalAddresses()}; }

  // Registers this owner in the directory (a stage answers PINGs and RELEASEs of members only).
  absl::Status Register(directory::DirectoryClient& client) {
    std::vector<std::string> addresses = transfer_->LocalAddresses();
    addresses.push_back(endpoint_->address());
    absl::StatusOr<uint64_t> epoch = client.Join(lid_, addresses, {});
    if (!epoch.ok()) return epoch.status();
    epoch_ = *epoch;
    return absl::OkStatus();
  }

  // A step for `id` at `start` with `n` tokens, addressed to `target`.
  StepSignal Step(uint64_t corr, uint64_t step, uint32_t attempt, const Hop& target, uint64_t id,
                  int32_t start, int32_t n) {
    TensorDict d;
    SetBatch(d, {id}, {start}, {n});
    std::vector<int64_t> hidden(static_cast<size_t>(n), 42);
    d.Set("hidden", Tensor::Of<int64_t>({n}, hidden));
    uint32_t slot = *ring_->Acquire(corr);
    StepSignal s;
    s.layout = Pack(d, ring_->payload(slot));
    uint64_t size = PackedSize(d);
    ring_->Seal(slot, corr, size);
    s.corr = corr;
    s.step = step;
    s.attempt = attempt;
    s.owner = Me();
    s.origin = Me();
    s.route = {target};
    s.hop = 0;
    s.request_ids = {id};
    s.start_positions = {start};
    s.num_tokens = {n};
    s.remote_addr = ring_->remote_addr(slot);
    s.length = size;
    return s;
  }

  void Send(const Hop& target, const StepSignal& s) { endpoint_->Send(target.signal, Encode(s)); }
  void SendTo(const Hop& target, const Signal& s) { endpoint_->Send(target.signal, Encode(s)); }

  // Signals received until `count` arrived (or 3 s passed).
  std::vector<Signal> Await(size_t count) {
    WaitUntil(
        [&] {
          connex::MutexLock lock(&mu_);
          return inbox_.size() >= count;
        },
        3000);
    connex::MutexLock lock(&mu_);
    return inbox_;
  }

 private:
  Lid lid_;
  uint64_t epoch_ = 1;
  transport::TransferEnginePtr transfer_;
  std::unique_ptr<SendRing> ring_;
  std::unique_ptr<SignalTransport> endpoint_;
  connex::Mutex mu_;
  std::vector<Signal> inbox_ ABSL_GUARDED_BY(mu_);
};

template <typename T>
std::vector<T> Only(const std::vector<Signal>& signals) {
  std::vector<T> out;
  for (const Signal& s : signals) {
    if (auto* t = std::get_if<T>(&s)) out.push_back(*t);
  }
  return out;
}

class RuleTest : public NodeTest {
 protected:
  void SetUp() override {
    NodeTest::SetUp();
    c_ = MakeCluster(2, 1);
    raw_ = std::make_unique<RawOwner>(*c_);
    StageNode* last = c_->node(1, 0);
    auto view = directory::testing::ConnectTo(*server_);
    (*view)->Watch(c_->model()).IgnoreError();
    for (const auto& r : (*view)->View(c_->model(), 1)) {
      target_.lid = r.lid;
      target_.epoch = r.epoch;
      for (const auto& a : r.addresses) {
        if (a.rfind("pp+", 0) == 0) target_.signal = a;
      }
    }
    ASSERT_EQ(target_.epoch, last->epoch());
    // The raw owner is a member, as a real owner is; the last stage has seen it join.
    owner_client_ = *directory::testing::ConnectTo(*server_);
    ASSERT_TRUE(raw_->Register(*owner_client_).ok());
    const Lid owner = raw_->Me().lid;
    ASSERT_TRUE(c_->client(1, 0)->AwaitView(
        c_->model(),
        [&](const std::vector<directory::Record>& v) {
          for (const auto& r : v) {
            if (r.lid == owner) return true;
          }
          return false;
        },
        5000));
  }
  std::unique_ptr<directory::DirectoryClient> owner_client_;
  std::unique_ptr<Cluster> c_;
  std::unique_ptr<RawOwner> raw_;
  Hop target_;
};

TEST_F(RuleTest, FencingRefusesASignalForAnotherEpoch) {
  Hop stale = target_;
  stale.epoch = target_.epoch - 1;
  raw_->Send(stale, raw_->Step(1, 100, 1, stale, 5, 0, 3));
  auto acks = Only<AckSignal>(raw_->Await(1));
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].code, static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(acks[0].message, HasSubstr("refused"));
  EXPECT_EQ(c_->engine(1, 0)->executions(), 0u);
  // stats() is published once per turn of the node's loop, after the reply went out.
  EXPECT_TRUE(WaitUntil([&] { return c_->node(1, 0)->stats().fenced == 1u; }, 5000))
      << "fenced: " << c_->node(1, 0)->stats().fenced;
}

TEST_F(RuleTest, ADuplicateCorrelationIdRunsOnce) {
  StepSignal s = raw_->Step(7, 101, 1, target_, 5, 0, 3);
  raw_->Send(target_, s);
  raw_->Send(target_, s);
  auto got = raw_->Await(3);
  EXPECT_EQ(Only<AckSignal>(got).size(), 2u);  // the duplicate is acknowledged again
  EXPECT_EQ(Only<ResultSignal>(got).size(), 1u);
  EXPECT_EQ(c_->engine(1, 0)->executions(), 1u);
  // stats() is published once per turn of the node's loop, after the reply went out.
  EXPECT_TRUE(WaitUntil([&] { return c_->node(1, 0)->stats().duplicates_dropped == 1u; }, 5000))
      << "duplicates_dropped: " << c_->node(1, 0)->stats().duplicates_dropped;
}

TEST_F(RuleTest, AResentAttemptIsAnsweredWithoutRunningTheStepAgain) {
  raw_->Send(target_, raw_->Step(8, 102, 1, target_, 5, 0, 3));
  raw_->Send(target_, raw_->Step(9, 102, 2, target_, 5, 0, 3));
  auto results = Only<ResultSignal>(raw_->Await(4));
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].attempt, 1u);
  EXPECT_EQ(results[1].attempt, 2u);
  EXPECT_EQ(results[0].tokens, results[1].tokens);
  EXPECT_EQ(c_->engine(1, 0)->executions(), 1u);
  // stats() is published once per turn of the node's loop, after the reply went out.
  EXPECT_TRUE(WaitUntil([&] { return c_->node(1, 0)->stats().steps_replayed == 1u; }, 5000))
      << "steps_replayed: " << c_->node(1, 0)->stats().steps_replayed;
  EXPECT_THAT(c_->violations(), ::testing::IsEmpty());
}

TEST_F(RuleTest, AStepWithoutItsStateIsReportedMissing) {
  raw_->Send(target_, raw_->Step(10, 103, 1, target_, 77, 5, 1));
  auto got = raw_->Await(2);
  auto missing = Only<MissingSignal>(got);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].request_ids, std::vector<uint64_t>{77});
  EXPECT_TRUE(Only<ResultSignal>(got).empty());
  EXPECT_EQ(c_->engine(1, 0)->executions(), 0u);
}

TEST_F(RuleTest, AStaleSlotIsNotConsumed) {
  StepSignal s = raw_->Step(11, 104, 1, target_, 5, 0, 3);
  s.corr = 12;  // the slot's header says 11: the payload was replaced
  raw_->Send(target_, s);
  auto acks = Only<AckSignal>(raw_->Await(1));
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].code, static_cast<uint32_t>(absl::StatusCode::kAborted));
  EXPECT_EQ(c_->engine(1, 0)->executions(), 0u);
}

// Found by the widened campaign (seed 227): a request re-prefilled in chunks moved back to a
// stage that still held its older, longer state; that stage ran a chunk at start 10 on 1512
// held positions. The engine must hold exactly start_position positions: it is reported
// missing (the owner recomputes), and its stale state is dropped.
TEST_F(RuleTest, AStepAtAnotherPositionThanTheStateHeldIsReportedMissing) {
  raw_->Send(target_, raw_->Step(20, 200, 1, target_, 5, 0, 3));  // 3 positions held
  ASSERT_EQ(Only<ResultSignal>(raw_->Await(2)).size(), 1u);
  raw_->Send(target_, raw_->Step(21, 201, 1, target_, 5, 1, 2));  // a chunk at position 1
  auto got = raw_->Await(4);
  auto missing = Only<MissingSignal>(got);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].request_ids, std::vector<uint64_t>{5});
  EXPECT_EQ(c_->engine(1, 0)->executions(), 1u);
  EXPECT_EQ(c_->engine(1, 0)->held_requests(), 0u);
  EXPECT_THAT(c_->violations(), ::testing::IsEmpty());
}

// A late step of a request that its owner released is not run: it would make state that
// nobody releases (found by the widened campaign: state left behind).
TEST_F(RuleTest, ALateStepOfAReleasedRequestIsNotRun) {
  StepSignal first = raw_->Step(30, 300, 1, target_, 6, 0, 3);
  first.owner_token = 77;
  raw_->Send(target_, first);
  ASSERT_EQ(Only<ResultSignal>(raw_->Await(2)).size(), 1u);
  raw_->SendTo(target_, ReleaseSignal{raw_->Me().lid, {6}, 77, 1, raw_->Me().signal, 301});
  ASSERT_EQ(Only<ReleasedSignal>(raw_->Await(3)).size(), 1u);
  EXPECT_EQ(c_->engine(1, 0)->held_requests(), 0u);
  StepSignal late = raw_->Step(31, 301, 1, target_, 6, 0, 3);  // an older attempt's prefill
  late.owner_token = 77;
  raw_->Send(target_, late);
  raw_->Await(4);  // its ACK
  EXPECT_EQ(c_->engine(1, 0)->executions(), 1u);
  EXPECT_EQ(c_->engine(1, 0)->held_requests(), 0u);
  // A RELEASE without the owner's token changes nothing.
  StepSignal again = raw_->Step(32, 302, 1, target_, 7, 0, 3);
  again.owner_token = 77;
  raw_->Send(target_, again);
  raw_->Await(6);
  raw_->SendTo(target_, ReleaseSignal{raw_->Me().lid, {7}, 12345, 2, raw_->Me().signal, 303});
  raw_->Await(7);
  EXPECT_EQ(c_->engine(1, 0)->held_requests(), 1u);
}

}  // namespace
}  // namespace connex::pp
