#include "connex/engine/sampler.h"

#include <unistd.h>

#include <cmath>
#include <map>

#include "connex/engine/generator.h"
#include "connex/engine/random_model.h"
#include "connex/engine/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Known answers of Philox4x32-10 (Random123's kat_vectors).
TEST(PhiloxTest, MatchesTheKnownAnswers) {
  EXPECT_THAT(Philox4x32({0, 0, 0, 0}, {0, 0}),
              ElementsAre(0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u));
  EXPECT_THAT(
      Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      ElementsAre(0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu));
  EXPECT_THAT(
      Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      ElementsAre(0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u));
}

TEST(UniformAtTest, DependsOnSeedAndPositionOnly) {
  EXPECT_EQ(UniformAt(7, 100), UniformAt(7, 100));
  EXPECT_NE(UniformAt(7, 100), UniformAt(7, 101));
  EXPECT_NE(UniformAt(7, 100), UniformAt(8, 100));
  double sum = 0;
  for (uint64_t p = 0; p < 10000; ++p) {
    double u = UniformAt(12345, p);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
}

pp::Sampling Sampled(float temperature, float top_p = 1, int32_t top_k = 0, uint64_t seed = 1) {
  pp::Sampling s;
  s.temperature = temperature;
  s.top_p = top_p;
  s.top_k = top_k;
  s.seed = seed;
  return s;
}

TEST(SampleTokenTest, GreedyIsTheFirstMaximumAndSoIsTopKOne) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(SampleToken(logits, pp::Sampling{}, 3), 1);
  EXPECT_EQ(SampleToken(logits, Sampled(1.5f, 1, /*top_k=*/1), 3), 1);
}

// The draws follow softmax(logits / T): 0.5 / 0.3 / 0.2 over 20000 positions (deterministic:
// the draws are a function of seed and position, so this cannot flake).
TEST(SampleTokenTest, DrawsFollowTheDistribution) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<int32_t, int> counts;
  for (uint64_t p = 0; p < 20000; ++p) ++counts[SampleToken(logits, Sampled(1.0f), p)];
  EXPECT_NEAR(counts[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(counts[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / 20000.0, 0.2, 0.02);
  // A low temperature sharpens it towards the maximum.
  counts.clear();
  for (uint64_t p = 0; p < 2000; ++p) ++counts[SampleToken(logits, Sampled(0.1f), p)];
  EXPECT_GT(counts[0], 1950);
}

TEST(SampleTokenTest, TopKAndTopPKeepOnlyTheMostProbable) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  for (uint64_t p = 0; p < 2000; ++p) {
    ASSERT_NE(SampleToken(logits, Sampled(1.0f, 1, /*top_k=*/2), p), 2);
    ASSERT_EQ(SampleToken(logits, Sampled(1.0f, /*top_p=*/0.5f), p), 0);   // 0.5 reaches 0.5
    ASSERT_NE(SampleToken(logits, Sampled(1.0f, /*top_p=*/0.75f), p), 2);  // 0.5 + 0.3 reach it
  }
}

TEST(SamplingTest, OutOfRangeFieldsAreNamed) {
  EXPECT_THAT(Sampled(2.5f).Validate().message(), HasSubstr("temperature 2.5"));
  EXPECT_THAT(Sampled(1, 0).Validate().message(), HasSubstr("top_p 0"));
  EXPECT_THAT(Sampled(1, 1, -3).Validate().message(), HasSubstr("top_k -3"));
  EXPECT_TRUE(Sampled(0.7f, 0.9f, 40).Validate().ok());
}

TEST(SamplingTest, AStepWithSomeSamplingKeysButNotAllIsRefused) {
  TensorDict d;
  pp::SetSampling(d, {Sampled(1.0f)});
  EXPECT_TRUE(pp::GetSampling(d, 1).ok());
  EXPECT_THAT(pp::GetSampling(d, 2).status().message(), HasSubstr("1 rows for a batch of 2"));
  TensorDict partial;
  partial.Set(pp::kSamplingTemperature, *d.Find(pp::kSamplingTemperature));
  EXPECT_THAT(pp::GetSampling(partial, 1).status().message(), HasSubstr("not all four"));
  EXPECT_EQ(pp::GetSampling(TensorDict{}, 3)->size(), 3u);  // none: greedy
}

// Sampled generation over a small random Llama: the tokens depend on (seed, position) alone —
// not on the batch, prefill chunks, a recompute, or a resume from prompt + tokens so far.
class SampledGenerationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(::testing::TempDir() + "/sampler-test." + std::to_string(::getpid()) +
                            ".safetensors");
    ModelConfig c;
    c.hidden_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.intermediate_size = 96;
    c.max_position_embeddings = 256;
    ASSERT_TRUE(WriteRandomModel(*path_, c, 5, DType::kF32).ok());
  }
  static void TearDownTestSuite() {
    ::unlink(path_->c_str());
    delete path_;
  }
  static std::vector<std::vector<int32_t>> Run(const std::vector<std::vector<int32_t>>& prompts,
                                               GenerateOptions options, int stages = 2) {
    auto pipeline = Pipeline::Load(*path_, stages, std::make_shared<ThreadPool>(1));
    EXPECT_TRUE(pipeline.ok()) << pipeline.status();
    auto out = Generate(**pipeline, prompts, options);
    EXPECT_TRUE(out.ok()) << out.status();
    std::vector<std::vector<int32_t>> tokens;
    for (const Generation& g : *out) tokens.push_back(g.tokens);
    return tokens;
  }
  static GenerateOptions Options(std::vector<pp::Sampling> sampling, int64_t max_tokens = 24) {
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.stop_at_eos = false;
    o.sampling = std::move(sampling);
    return o;
  }
  static std::string* path_;
};
std::string* SampledGenerationTest::path_ = nullptr;

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 17, 42, 99, 3}, {1, 250, 251}, {1, 7, 7, 7, 7, 7, 7, 7, 7, 7}};

TEST_F(SampledGenerationTest, TokensDoNotDependOnTheBatchChunksOrARecompute) {
  std::vector<pp::Sampling> s = {Sampled(0.9f, 0.95f, 0, 11), Sampled(1.3f, 1, 50, 12),
                                 Sampled(0.7f, 0.8f, 20, 13)};
  std::vector<std::vector<int32_t>> together = Run(kPrompts, Options(s));
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(Run({kPrompts[i]}, Options({s[i]}))[0], together[i]) << "prompt " << i << " alone";
  }
  GenerateOptions chunked = Options(s);
  chunked.prefill_chunk = 3;
  EXPECT_EQ(Run(kPrompts, chunked), together);
  GenerateOptions recomputed = Options(s);
  recomputed.recompute_at = 9;
  EXPECT_EQ(Run(kPrompts, recomputed), together);
  EXPECT_EQ(Run(kPrompts, Options(s), /*stages=*/1), together);
  // Sampling does choose: other seeds give other tokens, and greedy differs too.
  std::vector<pp::Sampling> other = s;
  for (pp::Sampling& x : other) x.seed += 100;
  EXPECT_NE(Run(kPrompts, Options(other)), together);
  EXPECT_NE(Run(kPrompts, Options({})), together);
}

// What the resume proxy does: prompt + the tokens already delivered as a new prompt, max_tokens
// reduced. The rest is exactly the undisturbed run's rest.
TEST_F(SampledGenerationTest, AResumeFromPromptPlusTokensSoFarContinuesExactly) {
  pp::Sampling s = Sampled(1.1f, 0.9f, 0, 77);
  std::vector<int32_t> full = Run({kPrompts[0]}, Options({s}, 24))[0];
  for (size_t k : {1, 10, 23}) {
    std::vector<int32_t> resumed_prompt = kPrompts[0];
    resumed_prompt.insert(resumed_prompt.end(), full.begin(), full.begin() + k);
    std::vector<int32_t> rest = Run({resumed_prompt}, Options({s}, 24 - k))[0];
    EXPECT_EQ(rest, std::vector<int32_t>(full.begin() + k, full.end())) << "resumed after " << k;
  }
}

}  // namespace
}  // namespace connex::engine
