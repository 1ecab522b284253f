#include "connex/pp/scheduler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::ElementsAre;

std::vector<ReadyRequest> OneTokenEach(int n) {
  std::vector<ReadyRequest> out;
  for (int i = 1; i <= n; ++i)
    out.push_back(ReadyRequest{static_cast<uint64_t>(i), 4, 5});  // a decode step each
  return out;
}

TEST(PlanStepsTest, BatchesInArrivalOrderUpToMaxBatch) {
  std::vector<PlannedStep> steps = PlanSteps(OneTokenEach(5), {2, 1000, 10});
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_THAT(steps[0].ids, ElementsAre(1u, 2u));
  EXPECT_THAT(steps[1].ids, ElementsAre(3u, 4u));
  EXPECT_THAT(steps[2].ids, ElementsAre(5u));
  EXPECT_THAT(steps[0].ends, ElementsAre(5u, 5u));
  EXPECT_EQ(steps[0].chunked, 0u);
}

TEST(PlanStepsTest, PlansNoMoreStepsThanThereArePlacesInFlight) {
  std::vector<PlannedStep> steps = PlanSteps(OneTokenEach(5), {2, 1000, 1});
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_THAT(steps[0].ids, ElementsAre(1u, 2u));  // 3, 4 and 5 wait for the next round
  EXPECT_TRUE(PlanSteps(OneTokenEach(5), {2, 1000, 0}).empty());
  EXPECT_TRUE(PlanSteps({}, {2, 1000, 4}).empty());
}

TEST(PlanStepsTest, ALongPromptIsSentInChunksThatFitTheTokenBudget) {
  std::vector<PlannedStep> steps = PlanSteps({{7, 0, 1000}}, {8, 300, 4});
  ASSERT_EQ(steps.size(), 1u);  // a request is in at most one step of a round
  EXPECT_THAT(steps[0].ends, ElementsAre(300u));
  EXPECT_EQ(steps[0].chunked, 1u);
  steps = PlanSteps({{7, 900, 1000}}, {8, 300, 4});  // its last chunk
  EXPECT_THAT(steps[0].ends, ElementsAre(1000u));
  EXPECT_EQ(steps[0].chunked, 0u);
}

TEST(PlanStepsTest, RequestsShareAStepsTokenBudgetInOrder) {
  std::vector<PlannedStep> steps = PlanSteps({{1, 0, 200}, {2, 0, 200}, {3, 4, 5}}, {8, 300, 4});
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_THAT(steps[0].ids, ElementsAre(1u, 2u));
  EXPECT_THAT(steps[0].ends, ElementsAre(200u, 100u));  // the second sends a chunk
  EXPECT_EQ(steps[0].chunked, 1u);
  EXPECT_THAT(steps[1].ids, ElementsAre(3u));
}

TEST(MaxStepTokensTest, FitsTheOutputOfAStepIntoASlot) {
  // Hidden size 4096 in fp32 (16 KiB a token) and the default 8 MiB slot: 511 tokens a step.
  EXPECT_EQ(MaxStepTokens(16384, 0, 8u << 20, 4096, 4), 511u);
  // The larger of the engine's figure and the measured one.
  EXPECT_EQ(MaxStepTokens(0, 16384, 8u << 20, 4096, 4), 511u);
  EXPECT_EQ(MaxStepTokens(8, 16384, 8u << 20, 4096, 4), 511u);
  // Unknown, or nothing is sent (one stage): no bound.
  EXPECT_EQ(MaxStepTokens(0, 0, 8u << 20, 4096, 4), UINT64_MAX);
  EXPECT_EQ(MaxStepTokens(16384, 0, 8u << 20, 4096, 1), UINT64_MAX);
  // A slot smaller than the overhead still carries something; at least one token.
  EXPECT_EQ(MaxStepTokens(8, 0, 4000, 4096, 2), 250u);
  EXPECT_EQ(MaxStepTokens(1 << 20, 0, 4000, 4096, 2), 1u);
}

TEST(StepInputTest, CarriesTheBatchTheTokensAndSamplingOnlyWhenARequestSamples) {
  Sampling seeded;
  seeded.temperature = 0.7f;
  seeded.seed = 5;
  TensorDict greedy = StepInput({1, 2}, {0, 4}, {3, 1}, {7, 8, 9, 10}, {Sampling{}, Sampling{}});
  absl::StatusOr<Batch> batch = GetBatch(greedy);
  ASSERT_TRUE(batch.ok());
  EXPECT_THAT(batch->request_ids, ElementsAre(1u, 2u));
  EXPECT_THAT(batch->start_positions, ElementsAre(0, 4));
  EXPECT_THAT(batch->num_tokens, ElementsAre(3, 1));
  absl::StatusOr<const Tensor*> tokens = greedy.Get(kTokens, DType::kI32, 1);
  ASSERT_TRUE(tokens.ok());
  EXPECT_THAT((*tokens)->values<int32_t>(), ElementsAre(7, 8, 9, 10));
  const size_t without = greedy.tensors().size();
  TensorDict sampled = StepInput({1, 2}, {0, 4}, {3, 1}, {7, 8, 9, 10}, {Sampling{}, seeded});
  EXPECT_GT(sampled.tensors().size(), without);  // the sampling keys travel with it
}

TEST(MeasuredBytesPerTokenTest, CountsOnlyTheRowsOfPerTokenTensors) {
  TensorDict out;
  SetBatch(out, {1, 2}, {0, 0}, {2, 2});
  out.Set("hidden", Tensor::Of<float>({4, 3}, std::vector<float>(12, 1.0f)));  // 12 bytes a row
  out.Set("per_request", Tensor::Of<int32_t>({2}, std::vector<int32_t>{5, 6}));
  EXPECT_EQ(MeasuredBytesPerToken(out, 4), 12u);
  EXPECT_EQ(MeasuredBytesPerToken(out, 0), 0u);
}

}  // namespace
}  // namespace connex::pp
