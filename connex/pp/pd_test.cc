// Prefill-decode disaggregation (pd.h) over the mem transport and mem signals with a real
// directory: one frontend, two prefill and two decode instances. A request is prefilled on one
// pool and decoded on the other with its KV handed over (no recompute); every failure ends with
// exactly the tokens of an undisturbed run: a prefill instance killed mid-prefill, one killed
// after the handoff, a decode instance killed mid-generation (from its standby's mirror, or from
// the prefill instance's retained copy), a handoff cut half way; a decode instance that joins
// mid-run takes traffic.
#include "connex/pp/pd.h"

#include <atomic>
#include <memory>

#include "connex/base/wait.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/pp/messages.h"
#include "connex/pp/testing/cluster.h"
#include "connex/pp/testing/expectations.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using testing::Cluster;
using testing::ReferenceTokens;

constexpr uint32_t kFrontend = kPdFrontendGroup;
constexpr uint32_t kPrefill = kPdPrefillGroup;
constexpr uint32_t kDecode = kPdDecodeGroup;

std::vector<int32_t> Prompt(uint64_t id, size_t extra = 0) {
  std::vector<int32_t> p;
  for (uint64_t i = 0; i < 3 + id % 5 + extra; ++i)
    p.push_back(static_cast<int32_t>((id * 31 + i * 7) % 200));
  return p;
}

class PdTest : public ::testing::Test {
 protected:
  void SetUp() override { server_ = *directory::testing::StartTestDirectory(); }

  // 1 frontend, `prefill` prefill and `decode` decode instances.
  std::unique_ptr<Cluster> MakeCluster(uint32_t prefill = 2, uint32_t decode = 2,
                                       StageNodeOptions o = testing::FastTestOptions()) {
    static int counter = 0;
    auto c = std::make_unique<Cluster>(*server_, "pd" + std::to_string(++counter), 2, 7, o);
    c->SetPd(true);
    EXPECT_NE(c->Start(kFrontend, 0), nullptr);
    for (uint32_t r = 0; r < prefill; ++r) EXPECT_NE(c->Start(kPrefill, r), nullptr);
    for (uint32_t r = 0; r < decode; ++r) EXPECT_NE(c->Start(kDecode, r), nullptr);
    EXPECT_TRUE(c->AwaitMembers(1 + prefill + decode).ok());
    return c;
  }

  void ExpectAllMatchReference(const Cluster& c, int max_new, size_t extra = 0) {
    testing::ExpectAllMatch(
        c, [&](uint64_t id) { return ReferenceTokens(2, Prompt(id, extra), max_new); });
  }

  // Every request ended: no engine holds state (prefill instances retain nothing past their
  // requests' RELEASE), no mirror is left.
  void ExpectNothingLeft(Cluster& c) { testing::ExpectNothingLeft(c); }

  // 6 requests of 300 tokens, handed over; decode instance 0 killed mid-generation; all end.
  void KillDecodeMidGeneration(Cluster& c) {
    c.fabric().SetReadDelay(Lid{c.model(), kFrontend, 0, 0}, 2);
    for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c.Submit(0, id, Prompt(id), 300).ok());
    ASSERT_TRUE(WaitUntil([&] { return c.TotalStats().pd_handoffs == 6; }, 10000));
    const uint64_t ran = c.engine(kDecode, 0)->executions();
    ASSERT_TRUE(WaitUntil([&] { return c.engine(kDecode, 0)->executions() > ran + 20; }, 10000));
    c.Kill(kDecode, 0);
    ASSERT_TRUE(c.AwaitAll(30000));
    ExpectAllMatchReference(c, 300);
  }

  std::unique_ptr<directory::DirectoryServer> server_;
};

TEST_F(PdTest, RequestsArePrefilledOnOnePoolAndDecodedOnTheOther) {
  auto c = MakeCluster();
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 40).ok());
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 40);
  StageNodeStats s = c->TotalStats();
  EXPECT_EQ(s.pd_handoffs, 8u);
  EXPECT_EQ(s.reprefills, 0u);
  EXPECT_EQ(s.lag_recomputes, 0u);
  EXPECT_EQ(s.kv_takeovers, 8u);  // every request's KV taken over, none recomputed
  EXPECT_GT(s.pd_handoff_bytes, 0u);
  // Each pool did its part, and both instances of each took requests (balanced by load).
  for (uint32_t r = 0; r < 2; ++r) {
    const uint64_t prefilled = c->engine(kPrefill, r)->executions();
    const uint64_t decoded = c->engine(kDecode, r)->executions();
    EXPECT_GT(prefilled, 0u) << "prefill " << r;
    EXPECT_GT(decoded, 0u) << "decode " << r;
    EXPECT_LE(prefilled, 8u) << "prefill " << r << " ran decode steps";
  }
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, APrefillInstanceKilledMidPrefillIsPrefilledAgainElsewhere) {
  StageNodeOptions o = testing::FastTestOptions();
  auto c = MakeCluster(2, 2, o);
  // Long prompts in many chunks (a slot holds few of the test engine's rows), read slowly from
  // the frontend: the prefill is under way when its instance dies.
  c->engine(kFrontend, 0)->SetOutputBytesPerToken(4096);
  c->fabric().SetReadDelay(Lid{c->model(), kFrontend, 0, 0}, 2);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id, 200), 20).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->engine(kPrefill, 0)->executions() > 3; }, 10000));
  ASSERT_EQ(c->TotalStats().pd_handoffs, 0u);  // still prefilling
  c->Kill(kPrefill, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 20, 200);
  StageNodeStats s = c->TotalStats();
  EXPECT_GT(s.reprefills, 0u);
  EXPECT_EQ(s.pd_handoffs, 4u);
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, APrefillInstanceKilledAfterItsHandoffLosesNothing) {
  auto c = MakeCluster();
  c->fabric().SetReadDelay(Lid{c->model(), kFrontend, 0, 0}, 2);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 200).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().pd_handoffs == 6; }, 10000));
  c->Kill(kPrefill, 0);
  c->Kill(kPrefill, 1);  // both: decoding needs neither
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 200);
  StageNodeStats s = c->TotalStats();
  EXPECT_EQ(s.reprefills, 0u);
  EXPECT_EQ(s.failovers, 0u);
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, ADecodeInstanceKilledMidGenerationResumesFromItsStandbysMirror) {
  StageNodeOptions o = testing::FastTestOptions();
  o.kv_standby = true;  // decode instances mirror to the next decode instance
  auto c = MakeCluster(2, 2, o);
  ASSERT_NO_FATAL_FAILURE(KillDecodeMidGeneration(*c));
  StageNodeStats s = c->TotalStats();
  EXPECT_EQ(s.reprefills, 0u);
  EXPECT_GT(s.failovers, 0u);
  EXPECT_GT(s.kv_takeovers + s.kv_takeovers_lagged, 6u);  // the handoffs, then the standby's
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, ADecodeInstanceKilledWithoutAStandbyResumesFromTheRetainedCopy) {
  auto c = MakeCluster();  // no KV standby: only the prefill instances' retained copies
  ASSERT_NO_FATAL_FAILURE(KillDecodeMidGeneration(*c));
  StageNodeStats s = c->TotalStats();
  EXPECT_EQ(s.reprefills, 0u);
  EXPECT_GT(s.pd_retained_resumes, 0u);
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, ARetentionThatRanOutMeansAReprefill) {
  StageNodeOptions o = testing::FastTestOptions();
  o.pd_retain_ms = 0;  // nothing is kept past the handoff's next turn
  auto c = MakeCluster(2, 2, o);
  c->fabric().SetReadDelay(Lid{c->model(), kFrontend, 0, 0}, 2);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 300).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().pd_retention_expired >= 4; }, 10000));
  const uint64_t ran = c->engine(kDecode, 0)->executions();
  ASSERT_TRUE(WaitUntil([&] { return c->engine(kDecode, 0)->executions() > ran + 20; }, 10000));
  c->Kill(kDecode, 0);
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 300);
  EXPECT_GT(c->TotalStats().reprefills, 0u);
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, AHandoffCutHalfWayIsRetriedNeverHalfApplied) {
  auto c = MakeCluster(1, 2);
  // Long prompts handed over in many updates; every other MIRROR and MIRRORED of the first ones
  // is lost, so handoffs stop part way and are sent again from what the decode side confirmed.
  c->engine(kFrontend, 0)->SetOutputBytesPerToken(4096);
  auto lost = std::make_shared<std::atomic<int>>(0);
  c->signals().SetFilter([lost](const std::string&, const std::string& frame) {
    absl::StatusOr<Signal> s = Decode(frame);
    if (!s.ok()) return true;
    const bool handoff =
        std::holds_alternative<MirrorSignal>(*s) || std::holds_alternative<MirroredSignal>(*s);
    return !(handoff && lost->fetch_add(1) % 2 == 0 && lost->load() < 40);
  });
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id, 100), 30).ok());
  ASSERT_TRUE(c->AwaitAll(30000));
  EXPECT_GT(lost->load(), 0);
  ExpectAllMatchReference(*c, 30, 100);
  EXPECT_GE(c->TotalStats().pd_handoffs, 4u);  // a handoff given up is made again
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, ADecodeInstanceThatJoinsMidRunTakesTraffic) {
  auto c = MakeCluster(2, 1);
  c->fabric().SetReadDelay(Lid{c->model(), kFrontend, 0, 0}, 2);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 120).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().pd_handoffs == 4; }, 10000));
  ASSERT_NE(c->Start(kDecode, 1), nullptr);
  ASSERT_TRUE(c->AwaitMembers(5).ok());
  // The new instance is the least loaded: the next requests go there.
  for (uint64_t id = 5; id <= 8; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 120).ok());
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 120);
  EXPECT_GT(c->engine(kDecode, 1)->executions(), 0u);
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, InstancesThatLeaveGracefullyHandTheirWorkOver) {
  StageNodeOptions o = testing::FastTestOptions();
  o.kv_standby = true;
  auto c = MakeCluster(2, 2, o);
  c->fabric().SetReadDelay(Lid{c->model(), kFrontend, 0, 0}, 2);
  for (uint64_t id = 1; id <= 6; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 200).ok());
  ASSERT_TRUE(WaitUntil([&] { return c->TotalStats().pd_handoffs == 6; }, 10000));
  c->Leave(kPrefill, 0);
  c->Leave(kDecode, 0);  // its requests go to its standby, which holds their mirrors
  for (uint64_t id = 7; id <= 8; ++id) ASSERT_TRUE(c->Submit(0, id, Prompt(id), 200).ok());
  ASSERT_TRUE(c->AwaitAll(30000));
  ExpectAllMatchReference(*c, 200);
  EXPECT_EQ(c->TotalStats().reprefills, 0u);
  ExpectNothingLeft(*c);
}

TEST_F(PdTest, ABadRoleIsRefusedByName) {
  StageNodeOptions o = testing::FastTestOptions();
  o.pd_role = PdRole::kDecode;
  o.stage = 0;
  o.stages = 2;
  absl::Status v = o.Validate();
  EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.message()), ::testing::HasSubstr("decode"));
  EXPECT_EQ(ParsePdRole("prefil", "--pd-role").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ParsePdRole("prefil", "--pd-role").status().message()),
              ::testing::HasSubstr("'prefil'"));
}

}  // namespace
}  // namespace connex::pp
