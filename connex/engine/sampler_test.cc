#include "connex/engine/sampler.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "connex/engine/generator.h"
#include "connex/engine/random_model.h"
#include "connex/engine/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/sanitized.h"

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

// The sampler's definition written plainly: candidates by an indirect comparison (most probable
// first, ties by the lower id), masses exp((l - max) / T) in double summed in that order, min_p
// then top_k then top_p, one uniform draw per position. SampleToken sorts 64-bit keys instead.
int32_t PlainSample(std::vector<float> logits, const pp::Sampling& sampling, uint64_t position,
                    std::span<const int32_t> history) {
  if (sampling.penalized()) ApplyRepetitionPenalty(logits, sampling.repetition_penalty, history);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = order.size();
  if (sampling.top_k > 0 && static_cast<size_t>(sampling.top_k) < keep) {
    keep = static_cast<size_t>(sampling.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep), order.end(),
                      before);
  } else {
    std::sort(order.begin(), order.end(), before);
  }
  const double max_logit = logits[order[0]];
  std::vector<double> mass(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    mass[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) / sampling.temperature);
    if (mass[i] < sampling.min_p) {
      keep = i;
      break;
    }
    total += mass[i];
  }
  if (sampling.top_p < 1) {
    const double target = static_cast<double>(sampling.top_p) * total;
    double sum = 0;
    size_t cut = 0;
    while (cut < keep) {
      sum += mass[cut++];
      if (sum >= target) break;
    }
    keep = cut;
    total = sum;
  }
  const double u = UniformAt(sampling.seed, position) * total;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    sum += mass[i];
    if (u < sum) return order[i];
  }
  return order[keep - 1];
}

TEST(SampleTokenTest, DrawsWhatThePlainDefinitionDraws) {
  // Logits with many ties (a coarse grid), zeros of both signs, negatives and a large range.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> grid(-400, 400);
  std::vector<float> logits(5000);
  for (float& l : logits) l = static_cast<float>(grid(rng)) / 16.0f;
  for (size_t i = 0; i < logits.size(); i += 97) logits[i] = (i % 2 != 0) ? -0.0f : 0.0f;
  logits[4321] = 40.0f;  // one far ahead: masses that underflow to 0 in double
  std::vector<int32_t> history = {3, 4321, 17, 17, 2500};
  std::vector<pp::Sampling> settings = {Sampled(0.7f, 0.9f), Sampled(1.0f, 1, 50),
                                        Sampled(1.3f, 0.5f, 100, 9), Sampled(0.05f),
                                        Sampled(2.0f, 0.95f, 0, 5)};
  settings.push_back(Sampled(0.8f, 1, 0, 3));
  settings.back().min_p = 0.05f;
  settings.push_back(Sampled(1.0f, 0.8f, 0, 4));
  settings.back().repetition_penalty = 1.3f;
  // 300 positions per setting; 60 under a sanitizer (at -O0 the 4,200 draws take 27 s there,
  // and what a sanitizer checks is the same on every position).
  const uint64_t positions = kSanitized ? 60 : 300;
  for (bool far : {true, false}) {
    if (!far) logits[4321] = 1.0f;
    for (const pp::Sampling& s : settings) {
      for (uint64_t p = 0; p < positions; ++p) {
        ASSERT_EQ(SampleToken(logits, s, p, history), PlainSample(logits, s, p, history))
            << "T " << s.temperature << " top_p " << s.top_p << " top_k " << s.top_k << " min_p "
            << s.min_p << " position " << p;
      }
    }
  }
}

TEST(SortCandidateKeysTest, OrdersAsStdSortOnAVocabularyWithTies) {
  // 128K candidates as SampleToken builds them (ids ascending), upper halves from a small set so
  // that most tie and the ids decide, with the extremes of the key range.
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> upper(0, 3000);
  std::vector<uint64_t> keys(128256);
  for (size_t id = 0; id < keys.size(); ++id) {
    uint32_t k = upper(rng) * 1431655u;  // spread over all 32 bits
    if (id % 1000 == 7) k = 0;
    if (id % 1000 == 9) k = 0xFFFFFFFFu;
    keys[id] = (uint64_t{k} << 32) | id;
  }
  std::vector<uint64_t> expected = keys;
  std::sort(expected.begin(), expected.end());
  SortCandidateKeys(keys);
  EXPECT_EQ(keys, expected);
  std::vector<uint64_t> none;
  SortCandidateKeys(none);
  EXPECT_TRUE(none.empty());
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
  pp::Sampling s = Sampled(1);
  s.min_p = 1.5f;
  EXPECT_THAT(s.Validate().message(), HasSubstr("min_p 1.5 is outside [0, 1]"));
  s.min_p = 1;
  EXPECT_TRUE(s.Validate().ok());
  for (float bad : {0.0f, -1.0f, INFINITY, NAN}) {
    s.repetition_penalty = bad;
    EXPECT_THAT(s.Validate().message(), HasSubstr("repetition_penalty")) << bad;
  }
  s.repetition_penalty = 0.5f;
  EXPECT_TRUE(s.Validate().ok());
}

// min_p keeps the tokens at least min_p times as probable as the most probable, after the
// temperature: 0.5 / 0.3 / 0.2 with min_p 0.5 drops the third (0.2 < 0.25) and keeps the second.
TEST(SampleTokenTest, MinPDropsTheTokensBelowItsShareOfTheMostProbable) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  pp::Sampling s = Sampled(1.0f);
  s.min_p = 0.5f;
  std::map<int32_t, int> counts;
  for (uint64_t p = 0; p < 4000; ++p) ++counts[SampleToken(logits, s, p)];
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(counts[0] / 4000.0, 0.625, 0.03);  // 0.5 / 0.8: the survivors renormalized
  // A higher temperature flattens the distribution first: 0.2 is then above half the maximum.
  s.temperature = 2.0f;
  counts.clear();
  for (uint64_t p = 0; p < 4000; ++p) ++counts[SampleToken(logits, s, p)];
  EXPECT_GT(counts[2], 500);
  // min_p 1 keeps the most probable alone; 0 keeps every token.
  s.min_p = 1;
  for (uint64_t p = 0; p < 500; ++p) ASSERT_EQ(SampleToken(logits, s, p), 0);
  s.min_p = 0;
  EXPECT_EQ(SampleToken(logits, s, 17), SampleToken(logits, Sampled(2.0f), 17));
}

// vLLM's order: min_p, then top_k and top_p over the survivors (top_p's mass is theirs). With
// min_p 0.5 the survivors are 0.5 / 0.3, renormalized 0.625 / 0.375, so top_p 0.6 keeps only the
// first — whereas top_p over the whole distribution (0.5 < 0.6) would keep two.
TEST(SampleTokenTest, TopPCountsTheMassOfTheMinPSurvivors) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  pp::Sampling s = Sampled(1.0f, /*top_p=*/0.6f);
  s.min_p = 0.5f;
  for (uint64_t p = 0; p < 2000; ++p) ASSERT_EQ(SampleToken(logits, s, p), 0);
  s.top_k = 1;
  EXPECT_EQ(SampleToken(logits, s, 3), 0);
}

// vLLM's and Hugging Face's rule, once per distinct id of the prompt and output so far.
TEST(RepetitionPenaltyTest, DividesPositiveAndMultipliesOtherLogitsOfSeenTokensOnce) {
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f};
  const std::vector<int32_t> history = {0, 1, 1, 1, 4, 99, -5};  // 99 and -5: not in the vocab
  ApplyRepetitionPenalty(logits, 2.0f, history);
  EXPECT_THAT(logits, ElementsAre(1.0f, -2.0f, 0.5f, 3.0f, 0.0f));
}

TEST(RepetitionPenaltyTest, AppliesToGreedyAndSampledChoices) {
  const std::vector<float> logits = {3.0f, 2.5f, -4.0f};
  pp::Sampling greedy;
  EXPECT_EQ(SampleToken(logits, greedy, 5, std::vector<int32_t>{0}), 0);  // penalty 1: none
  greedy.repetition_penalty = 1.5f;                                       // 3 / 1.5 = 2 < 2.5
  EXPECT_EQ(SampleToken(logits, greedy, 5, std::vector<int32_t>{0}), 1);
  EXPECT_EQ(SampleToken(logits, greedy, 5, {}), 0);  // nothing seen: nothing penalized
  greedy.repetition_penalty = 0.5f;                  // < 1 favours what was seen: 2.5 / 0.5 = 5
  EXPECT_EQ(SampleToken(logits, greedy, 5, std::vector<int32_t>{1}), 1);
  // Sampled: token 0 is drawn with p 0.62, or 0.08 once seen with penalty 100 (logit 0.03).
  pp::Sampling sampled = Sampled(1.0f);
  std::map<int32_t, int> counts, penalized;
  sampled.repetition_penalty = 100;
  for (uint64_t p = 0; p < 2000; ++p) {
    ++counts[SampleToken(logits, Sampled(1.0f), p, std::vector<int32_t>{0})];
    ++penalized[SampleToken(logits, sampled, p, std::vector<int32_t>{0})];
  }
  EXPECT_NEAR(counts[0] / 2000.0, 0.62, 0.03);
  EXPECT_NEAR(penalized[0] / 2000.0, 0.08, 0.02);
}

TEST(SamplingTest, KeysTravelOnlyWhenARequestNeedsThemAndTheHistoryOnlyWithAPenalty) {
  auto step = [](std::vector<pp::Sampling> sampling) {
    TensorDict d;
    pp::SetBatch(d, {1, 2}, {0, 3}, {3, 1});
    d.Set(pp::kTokens, Tensor::Of<int32_t>({4}, std::vector<int32_t>{7, 8, 9, 10}));
    pp::AddSamplingKeys(d, sampling);
    return d;
  };
  pp::Sampling plain, penalized, min_p_only = Sampled(0.8f);
  penalized.repetition_penalty = 1.2f;  // greedy, but not the plain argmax
  min_p_only.min_p = 0.1f;
  EXPECT_EQ(step({plain, plain}).Find(pp::kSamplingSeed), nullptr);
  TensorDict sampled = step({plain, min_p_only});
  EXPECT_NE(sampled.Find(pp::kSamplingMinP), nullptr);
  EXPECT_EQ(sampled.Find(pp::kSamplingHistory), nullptr);
  TensorDict with_penalty = step({penalized, min_p_only});
  absl::StatusOr<const Tensor*> history = pp::GetSamplingHistory(with_penalty, 4);
  ASSERT_TRUE(history.ok() && *history != nullptr);
  EXPECT_THAT((*history)->values<int32_t>(), ElementsAre(7, 8, 9, 10));
  EXPECT_THAT(pp::GetSamplingHistory(with_penalty, 5).status().message(),
              HasSubstr("4 rows for a step of 5 tokens"));
  absl::StatusOr<std::vector<pp::Sampling>> back = pp::GetSampling(with_penalty, 2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)[0].repetition_penalty, 1.2f);
  EXPECT_EQ((*back)[1].min_p, 0.1f);
  // A step of an owner that predates min_p and the penalty: their defaults.
  TensorDict old;
  pp::SetSampling(old, {min_p_only});
  old.Erase(pp::kSamplingMinP);
  old.Erase(pp::kSamplingRepetitionPenalty);
  back = pp::GetSampling(old, 1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)[0].min_p, 0);
  EXPECT_EQ((*back)[0].repetition_penalty, 1);
}

// The history is request state beside the KV cache: appended by each step, cut back to a step's
// start, started afresh at 0 (a recompute), dropped by Release; a step that cannot be recorded
// is refused whole.
TEST(TokenHistoryTest, FollowsTheStepsAsTheKvCacheDoes) {
  pp::Sampling penalized;
  penalized.repetition_penalty = 1.3f;
  const std::vector<pp::Sampling> one = {penalized};
  auto step = [](int64_t start, std::vector<int32_t> tokens, bool with_history = true) {
    TensorDict d;
    const int32_t n = static_cast<int32_t>(tokens.size());
    pp::SetBatch(d, {9}, {static_cast<int32_t>(start)}, {n});
    if (with_history) d.Set(pp::kSamplingHistory, Tensor::Of<int32_t>({n}, tokens));
    return d;
  };
  TokenHistory h;
  auto run = [&](int64_t start, std::vector<int32_t> tokens, bool with_history = true) {
    TensorDict d = step(start, tokens, with_history);
    const std::vector<uint64_t> ids = {9};
    const std::vector<int64_t> starts = {start}, counts = {static_cast<int64_t>(tokens.size())};
    absl::Status ok = h.Check(d, ids, starts, counts, one);
    if (ok.ok()) h.Record(d, ids, starts, counts, one);
    return ok;
  };
  ASSERT_TRUE(run(0, {1, 2, 3}).ok());
  ASSERT_TRUE(run(3, {4}).ok());
  EXPECT_THAT(h.Of(9), ElementsAre(1, 2, 3, 4));
  ASSERT_TRUE(run(2, {7}).ok());  // a rewind
  EXPECT_THAT(h.Of(9), ElementsAre(1, 2, 7));
  EXPECT_THAT(run(5, {8}).message(), HasSubstr("starts at 5 but 3 tokens of its history"));
  EXPECT_THAT(run(3, {8}, /*with_history=*/false).message(),
              HasSubstr("repetition_penalty 1.3 but the step carries no sampling.history"));
  EXPECT_THAT(h.Of(9), ElementsAre(1, 2, 7));  // the refused steps changed nothing
  ASSERT_TRUE(run(0, {1, 2, 7, 8}).ok());      // a recompute: prompt + generated from 0
  EXPECT_THAT(h.Of(9), ElementsAre(1, 2, 7, 8));
  h.Release(9);
  EXPECT_TRUE(h.Of(9).empty());
  EXPECT_EQ(h.size(), 0u);
}

// A state import appends rows at the held length (0: afresh); DropState cuts back.
TEST(TokenHistoryTest, AppendsImportedRowsAndCutsBack) {
  TokenHistory h;
  const std::vector<int32_t> head = {1, 2, 3}, tail = {4, 5};
  h.Append(9, 0, head);
  h.Append(9, 3, tail);
  EXPECT_THAT(h.Of(9), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(h.Size(9), 5);
  h.CutBack(9, 7);  // holds no more: no-op
  h.CutBack(9, 2);
  EXPECT_THAT(h.Of(9), ElementsAre(1, 2));
  h.Append(9, 0, tail);  // afresh
  EXPECT_THAT(h.Of(9), ElementsAre(4, 5));
  h.CutBack(9, 0);
  EXPECT_EQ(h.size(), 0u);
  EXPECT_EQ(h.Size(9), 0);
  h.CutBack(3, 1);  // not held: no-op
  EXPECT_EQ(h.size(), 0u);
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
// reduced. The rest is exactly the undisturbed run's rest — with min_p and a repetition penalty
// too (the penalty's set, prompt plus output, is the same set of tokens after a resume).
TEST_F(SampledGenerationTest, AResumeFromPromptPlusTokensSoFarContinuesExactly) {
  pp::Sampling min_p_and_penalty = Sampled(1.1f, 0.9f, 0, 78);
  min_p_and_penalty.min_p = 0.05f;
  min_p_and_penalty.repetition_penalty = 1.4f;
  pp::Sampling greedy_penalty;
  greedy_penalty.repetition_penalty = 1.8f;
  for (const pp::Sampling& s : {Sampled(1.1f, 0.9f, 0, 77), min_p_and_penalty, greedy_penalty}) {
    std::vector<int32_t> full = Run({kPrompts[0]}, Options({s}, 24))[0];
    for (size_t k : {1, 10, 23}) {
      std::vector<int32_t> resumed_prompt = kPrompts[0];
      resumed_prompt.insert(resumed_prompt.end(), full.begin(), full.begin() + k);
      std::vector<int32_t> rest = Run({resumed_prompt}, Options({s}, 24 - k))[0];
      EXPECT_EQ(rest, std::vector<int32_t>(full.begin() + k, full.end()))
          << "resumed after " << k << " (repetition_penalty " << s.repetition_penalty << ")";
    }
  }
}

// The penalty's history lives on the last stage beside its KV cache: however the request's
// state is built — alone or in a batch with unpenalized requests, in prefill chunks, dropped and
// recomputed, on one stage or two — the tokens are the same.
TEST_F(SampledGenerationTest, PenalizedTokensDoNotDependOnTheBatchChunksOrARecompute) {
  pp::Sampling greedy_penalty, sampled_penalty = Sampled(0.9f, 1, 0, 21), min_p = Sampled(1.2f);
  greedy_penalty.repetition_penalty = 1.8f;
  sampled_penalty.repetition_penalty = 1.3f;
  sampled_penalty.min_p = 0.1f;
  min_p.min_p = 0.2f;
  std::vector<pp::Sampling> s = {greedy_penalty, sampled_penalty, min_p};
  std::vector<std::vector<int32_t>> together = Run(kPrompts, Options(s));
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(Run({kPrompts[i]}, Options({s[i]}))[0], together[i]) << "prompt " << i << " alone";
  }
  GenerateOptions chunked = Options(s);
  chunked.prefill_chunk = 4;
  EXPECT_EQ(Run(kPrompts, chunked), together);
  GenerateOptions recomputed = Options(s);
  recomputed.recompute_at = 7;
  EXPECT_EQ(Run(kPrompts, recomputed), together);
  EXPECT_EQ(Run(kPrompts, Options(s), /*stages=*/1), together);
  // The penalty does act: greedy without it repeats itself differently.
  EXPECT_NE(Run({kPrompts[2]}, Options({pp::Sampling{}}))[0],
            Run({kPrompts[2]}, Options({greedy_penalty}))[0]);
}

}  // namespace
}  // namespace connex::engine
