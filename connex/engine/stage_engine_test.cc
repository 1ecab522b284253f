// The engine's contract: a correct Llama forward pass (against a naive double-precision reference)
// whose logits and tokens are bitwise independent of batch composition, prefill chunking, KV cache
// recomputation, the number of stages and the number of threads.
#include "connex/engine/stage_engine.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "connex/base/strings.h"
#include "connex/engine/generator.h"
#include "connex/engine/pipeline.h"
#include "connex/engine/random_model.h"
#include "connex/engine/safetensors.h"
#include "connex/engine/tokenizer.h"
#include "connex/pp/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::engine {
namespace {

using ::testing::HasSubstr;

ModelConfig TestConfig() {
  ModelConfig c;
  c.hidden_size = 72;  // head_dim 18 and hidden 72: both exercise the kernels' tails
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 100;
  c.max_position_embeddings = 256;
  return c;
}

class EngineTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(testing::TempDir() + "/engine-test." + std::to_string(::getpid()) +
                            ".safetensors");
    ASSERT_TRUE(WriteRandomModel(*path_, TestConfig(), 42, DType::kF32).ok());
  }
  static void TearDownTestSuite() {
    ::unlink(path_->c_str());
    delete path_;
  }

  static std::unique_ptr<Pipeline> Load(int stages, int threads = 2) {
    auto p = Pipeline::Load(*path_, stages, std::make_shared<ThreadPool>(threads));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  static std::vector<std::vector<int32_t>> Prompts() {
    std::vector<std::vector<int32_t>> prompts;
    for (const char* text :
         {"Hello, world", "The quick brown fox jumps over the lazy dog.", "a",
          "Endpoint mobility needs bit-exact recomputation \xe2\x9c\x93", "0123456789"}) {
      prompts.push_back(Tokenize(text, /*add_bos=*/true));
    }
    return prompts;
  }

  static GenerateOptions Options() {
    GenerateOptions o;
    o.max_tokens = 10;
    o.stop_at_eos = false;
    o.keep_logits = true;
    return o;
  }

  // Each prompt alone, whole prefill, one stage: the reference.
  static std::vector<Generation> Alone() {
    auto pipeline = Load(1);
    std::vector<Generation> out;
    for (const auto& prompt : Prompts()) {
      auto g = Generate(*pipeline, {prompt}, Options());
      EXPECT_TRUE(g.ok()) << g.status();
      out.push_back((*g)[0]);
    }
    return out;
  }

  static void ExpectBitwiseEqual(const std::vector<Generation>& expected,
                                 const std::vector<Generation>& actual, const std::string& what) {
    ASSERT_EQ(expected.size(), actual.size()) << what;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(expected[i].tokens, actual[i].tokens) << what << ", prompt " << i;
      ASSERT_EQ(expected[i].logits.size(), actual[i].logits.size()) << what;
      for (size_t s = 0; s < expected[i].logits.size(); ++s) {
        const auto& a = expected[i].logits[s];
        const auto& b = actual[i].logits[s];
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << what << ": logits of prompt " << i << ", token " << s << " differ";
      }
    }
  }

  static std::string* path_;
};

std::string* EngineTest::path_ = nullptr;

// A naive Llama forward pass in double precision, written from the architecture's definition
// independently of the engine: the logits of the last position of `tokens`.
std::vector<double> ReferenceLogits(const ModelConfig& c, const TensorDict& w,
                                    const std::vector<int32_t>& tokens) {
  auto W = [&](const std::string& name) { return w.tensors().at(name).values<float>(); };
  const int64_t d = c.hidden_size, hd = c.head_dim(), nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, f = c.intermediate_size, n = tokens.size();
  auto matvec = [](std::span<const float> m, const std::vector<double>& x, int64_t rows) {
    std::vector<double> y(rows, 0.0);
    const int64_t cols = x.size();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < cols; ++i) y[r] += m[r * cols + i] * x[i];
    }
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, std::span<const float> g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    double inv = 1.0 / std::sqrt(ss / x.size() + c.rms_norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * g[i];
    return y;
  };
  auto rope = [&](std::vector<double>& v, int64_t heads, int64_t pos) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < hd / 2; ++i) {
        double theta = pos * std::pow(c.rope_theta, -2.0 * i / hd);
        double a = v[h * hd + i], b = v[h * hd + i + hd / 2];
        v[h * hd + i] = a * std::cos(theta) - b * std::sin(theta);
        v[h * hd + i + hd / 2] = b * std::cos(theta) + a * std::sin(theta);
      }
    }
  };
  std::vector<std::vector<double>> h(n, std::vector<double>(d));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < d; ++i) h[t][i] = W("model.embed_tokens.weight")[tokens[t] * d + i];
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      auto x = rmsnorm(h[t], W(p + "input_layernorm.weight"));
      q[t] = matvec(W(p + "self_attn.q_proj.weight"), x, nh * hd);
      k[t] = matvec(W(p + "self_attn.k_proj.weight"), x, nkv * hd);
      v[t] = matvec(W(p + "self_attn.v_proj.weight"), x, nkv * hd);
      rope(q[t], nh, t);
      rope(k[t], nkv, t);
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> attn(nh * hd, 0.0);
      for (int64_t hh = 0; hh < nh; ++hh) {
        int64_t kvh = hh / (nh / nkv);
        std::vector<double> s(t + 1);
        double max = -1e300, sum = 0;
        for (int64_t j = 0; j <= t; ++j) {
          s[j] = 0;
          for (int64_t i = 0; i < hd; ++i) s[j] += q[t][hh * hd + i] * k[j][kvh * hd + i];
          s[j] /= std::sqrt(static_cast<double>(hd));
          max = std::max(max, s[j]);
        }
        for (double& x : s) sum += (x = std::exp(x - max));
        for (int64_t j = 0; j <= t; ++j) {
          for (int64_t i = 0; i < hd; ++i) attn[hh * hd + i] += s[j] / sum * v[j][kvh * hd + i];
        }
      }
      auto o = matvec(W(p + "self_attn.o_proj.weight"), attn, d);
      for (int64_t i = 0; i < d; ++i) h[t][i] += o[i];
      auto x = rmsnorm(h[t], W(p + "post_attention_layernorm.weight"));
      auto g = matvec(W(p + "mlp.gate_proj.weight"), x, f);
      auto u = matvec(W(p + "mlp.up_proj.weight"), x, f);
      for (int64_t i = 0; i < f; ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      auto down = matvec(W(p + "mlp.down_proj.weight"), g, d);
      for (int64_t i = 0; i < d; ++i) h[t][i] += down[i];
    }
  }
  return matvec(W("lm_head.weight"), rmsnorm(h[n - 1], W("model.norm.weight")), c.vocab_size);
}

TEST_F(EngineTest, MatchesANaiveDoublePrecisionLlama) {
  auto pipeline = Load(1);
  TensorDict weights = RandomModelTensors(TestConfig(), 42, DType::kF32);
  for (const auto& prompt : Prompts()) {
    GenerateOptions o = Options();
    o.max_tokens = 1;
    auto g = Generate(*pipeline, {prompt}, o);
    ASSERT_TRUE(g.ok()) << g.status();
    std::vector<double> expected = ReferenceLogits(TestConfig(), weights, prompt);
    const std::vector<float>& logits = (*g)[0].logits[0];
    double spread = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(logits[i], expected[i], 1e-3 * (1 + std::fabs(expected[i]))) << i;
      spread = std::max(spread, std::fabs(expected[i] - expected[0]));
    }
    EXPECT_GT(spread, 0.1);  // the logits carry information
  }
}

TEST_F(EngineTest, OutputsAreNotDegenerate) {
  std::vector<Generation> alone = Alone();
  std::set<int32_t> distinct;
  for (const Generation& g : alone) distinct.insert(g.tokens.begin(), g.tokens.end());
  EXPECT_GE(distinct.size(), 3u);
  EXPECT_NE(alone[0].logits[0], alone[1].logits[0]);
  EXPECT_NE(alone[0].logits[0], alone[0].logits[1]);
}

TEST_F(EngineTest, BatchInvariance) {
  std::vector<Generation> alone = Alone();
  auto pipeline = Load(1);
  ExpectBitwiseEqual(alone, *Generate(*pipeline, Prompts(), Options()), "one batch");
  GenerateOptions o = Options();
  o.max_batch = 2;  // requests join while others decode: mixed prefill + decode steps
  ExpectBitwiseEqual(alone, *Generate(*pipeline, Prompts(), o), "continuous batching");
  // The same prompts in another order and with other neighbours.
  std::vector<std::vector<int32_t>> reversed = Prompts();
  std::reverse(reversed.begin(), reversed.end());
  std::vector<Generation> rev = *Generate(*pipeline, reversed, o);
  std::reverse(rev.begin(), rev.end());
  ExpectBitwiseEqual(alone, rev, "reversed batch");
  EXPECT_EQ(pipeline->stage(0).num_requests(), 0u);  // every finished request was released
}

TEST_F(EngineTest, PrefillDecodeInvariance) {
  std::vector<Generation> alone = Alone();
  auto pipeline = Load(1);
  for (int64_t chunk : {1, 3, 7}) {
    GenerateOptions o = Options();
    o.prefill_chunk = chunk;
    ExpectBitwiseEqual(alone, *Generate(*pipeline, Prompts(), o),
                       "prefill chunk " + std::to_string(chunk));
  }
}

TEST_F(EngineTest, RecomputeInvariance) {
  std::vector<Generation> alone = Alone();
  auto pipeline = Load(1);
  for (int64_t k : {1, 3, 7}) {
    GenerateOptions o = Options();
    o.recompute_at = k;
    std::vector<Generation> g = *Generate(*pipeline, Prompts(), o);
    ExpectBitwiseEqual(alone, g, "recompute at " + std::to_string(k));
    for (const Generation& r : g) EXPECT_TRUE(r.recomputed);
    // Re-prefilled in chunks of 4 tokens: the rebuild takes extra steps, same results.
    o.prefill_chunk = 4;
    g = *Generate(*pipeline, Prompts(), o);
    ExpectBitwiseEqual(alone, g, "recompute at " + std::to_string(k) + ", chunked");
    EXPECT_GT(g[1].steps, alone[1].steps + 3);
  }
}

TEST_F(EngineTest, StageAndThreadInvariance) {
  std::vector<Generation> alone = Alone();
  for (int stages : {2, 3, 4}) {
    for (int threads : {1, 3}) {
      auto pipeline = Load(stages, threads);
      GenerateOptions o = Options();
      o.max_batch = 3;
      ExpectBitwiseEqual(
          alone, *Generate(*pipeline, Prompts(), o),
          std::to_string(stages) + " stages, " + std::to_string(threads) + " threads");
    }
  }
}

TensorDict StepOf(std::vector<int64_t> ids, std::vector<int32_t> starts,
                  std::vector<int32_t> counts, std::vector<int32_t> tokens) {
  TensorDict t;
  const int64_t b = ids.size();
  t.Set(kRequestIds, Tensor::Of<int64_t>({b}, ids));
  t.Set(kStartPositions, Tensor::Of<int32_t>({b}, starts));
  t.Set(kNumTokens, Tensor::Of<int32_t>({b}, counts));
  t.Set(kTokens, Tensor::Of<int32_t>({static_cast<int64_t>(tokens.size())}, tokens));
  return t;
}

TEST_F(EngineTest, MissingRequestsAndRewind) {
  auto pipeline = Load(2);
  StageEngine& s0 = pipeline->stage(0);
  StageEngine& s1 = pipeline->stage(1);
  TensorDict decode = StepOf({7}, {4}, {1}, {'e'});
  EXPECT_EQ(s0.MissingRequests(decode), std::vector<uint64_t>{7});
  auto missing = pipeline->Step(decode);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("request 7"));
  EXPECT_FALSE(s0.HoldsRequest(7));

  ASSERT_TRUE(pipeline->Step(StepOf({7}, {0}, {4}, {kBosToken, 'a', 'b', 'c'})).ok());
  EXPECT_EQ(s0.CachedPositions(7), 4);
  EXPECT_EQ(s1.CachedPositions(7), 4);
  EXPECT_TRUE(s0.MissingRequests(decode).empty());
  auto first = pipeline->Step(decode);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(s1.CachedPositions(7), 5);
  // Re-sending the step (start 4 < 5 cached) rewinds the cache and gives the same logits.
  auto again = pipeline->Step(decode);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*first->Find(kLogits), *again->Find(kLogits));
  // A step past the cache is missing on both stages.
  EXPECT_EQ(s1.MissingRequests(StepOf({7}, {9}, {1}, {'x'})), std::vector<uint64_t>{7});
  // Stage 1 alone lost the request (as after a failover): stage 0's output is refused there.
  s1.Release(7);
  auto hidden = s0.ExecuteStep(decode);
  ASSERT_TRUE(hidden.ok());
  EXPECT_EQ(s1.ExecuteStep(*hidden).status().code(), absl::StatusCode::kNotFound);
  pipeline->Release(7);
  EXPECT_FALSE(s0.HoldsRequest(7));
}

TEST_F(EngineTest, MalformedStepsAreRejectedWithoutSideEffects) {
  auto pipeline = Load(2);
  StageEngine& s0 = pipeline->stage(0);
  auto err = [&](const TensorDict& step) {
    return std::string(s0.ExecuteStep(step).status().message());
  };
  EXPECT_THAT(err(StepOf({1}, {0}, {2}, {kBosToken, 300})), HasSubstr("token 300"));
  EXPECT_THAT(err(StepOf({1, 1}, {0, 0}, {1, 1}, {1, 2})), HasSubstr("request 1 appears twice"));
  EXPECT_THAT(err(StepOf({1}, {0}, {3}, {1, 2})), HasSubstr("'tokens' has 2 entries"));
  EXPECT_THAT(err(StepOf({1}, {250}, {10}, std::vector<int32_t>(10, 1))),
              HasSubstr("max_position_embeddings"));
  EXPECT_THAT(err(StepOf({1}, {0}, {0}, {})), HasSubstr("positions [0, 0)"));
  TensorDict no_ids = StepOf({1}, {0}, {1}, {1});
  no_ids.Erase(kRequestIds);
  EXPECT_THAT(err(no_ids), HasSubstr("'request_ids' is missing"));
  EXPECT_EQ(s0.num_requests(), 0u);

  auto out = s0.ExecuteStep(StepOf({1}, {0}, {2}, {kBosToken, 'x'}));
  ASSERT_TRUE(out.ok());
  const Tensor* h = out->Find(kHidden);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->shape, (std::vector<int64_t>{2, 72}));
  TensorDict bad = *out;
  bad.Set(kHidden, Tensor::Zeros<float>({2, 71}));
  EXPECT_THAT(std::string(pipeline->stage(1).ExecuteStep(bad).status().message()),
              HasSubstr("'hidden' has shape [2, 71], expected [2, 72]"));
  EXPECT_FALSE(pipeline->stage(1).HoldsRequest(1));
}

TEST_F(EngineTest, ImplementsTheEngineContract) {
  auto pipeline = Load(2);
  pp::Engine& first = pipeline->stage(0);
  pp::Engine& last = pipeline->stage(1);
  std::vector<int32_t> prompt = Tokenize("contract", /*add_bos=*/true);
  TensorDict prefill;
  pp::SetBatch(prefill, {11}, {0}, {static_cast<int32_t>(prompt.size())});
  prefill.Set(pp::kTokens, Tensor::Of<int32_t>({static_cast<int64_t>(prompt.size())}, prompt));
  auto hidden = first.ExecuteStep(prefill);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  auto out = last.ExecuteStep(*hidden);
  ASSERT_TRUE(out.ok()) << out.status();
  auto batch = pp::GetBatch(*out);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->request_ids, std::vector<uint64_t>{11});
  ASSERT_TRUE(out->Get(pp::kNextTokens, pp::DType::kI32, 1).ok());
  int32_t token = out->Find(pp::kNextTokens)->values<int32_t>()[0];
  auto one_stage = Load(1);
  EXPECT_EQ(token, (*Generate(*one_stage, {prompt}, Options()))[0].tokens[0]);

  TensorDict decode;
  pp::SetBatch(decode, {11}, {static_cast<int32_t>(prompt.size())}, {1});
  decode.Set(pp::kTokens, Tensor::Of<int32_t>({1}, std::vector<int32_t>{token}));
  EXPECT_TRUE(first.MissingRequests(decode).empty());
  EXPECT_TRUE(last.HoldsRequest(11));
  last.Release(11);
  EXPECT_FALSE(last.HoldsRequest(11));
  auto h2 = first.ExecuteStep(decode);
  ASSERT_TRUE(h2.ok());
  EXPECT_EQ(last.MissingRequests(*h2), std::vector<uint64_t>{11});
  EXPECT_EQ(last.ExecuteStep(*h2).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EngineTest, HalfPrecisionCheckpointsLoadAndRun) {
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    std::string path = *path_ + "." + std::string(DTypeName(dtype));
    ASSERT_TRUE(WriteRandomModel(path, TestConfig(), 42, dtype).ok());
    auto pipeline = Pipeline::Load(path, 2, std::make_shared<ThreadPool>(2));
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    auto g = Generate(**pipeline, {Prompts()[1]}, Options());
    ASSERT_TRUE(g.ok());
    // Weights rounded to 16 bits: close to the F32 model's logits, not equal.
    std::vector<float> f32 = Alone()[1].logits[0];
    std::vector<float> half = (*g)[0].logits[0];
    double max_diff = 0;
    for (size_t i = 0; i < f32.size(); ++i)
      max_diff = std::max(max_diff, double(std::fabs(f32[i] - half[i])));
    EXPECT_GT(max_diff, 0.0);
    EXPECT_LT(max_diff, dtype == DType::kF16 ? 0.05 : 0.5);
    ::unlink(path.c_str());
  }
}

// A 16-bit checkpoint is computed in its own precision (mapped, widened in registers): its logits
// and tokens are bitwise those of the same weights widened to F32 in the file, batched, over 1 and
// 3 stages, with 1 and 3 threads. Norm weights are random here, not ones, so that they count.
TEST_F(EngineTest, HalfPrecisionWeightsGiveTheBitsOfTheirWidenedCopy) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(0.5f, 1.5f);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    TensorDict half = RandomModelTensors(TestConfig(), 42, dtype);
    const TensorDict f32 = RandomModelTensors(TestConfig(), 42, DType::kF32);
    for (const auto& [name, t] : f32.tensors()) {
      if (name.find("norm") == std::string::npos) continue;
      std::vector<float> values(t.num_elements());
      for (float& v : values) v = dist(rng);
      half.Set(name, ConvertF32(Tensor::Of<float>(t.shape, values), dtype));
    }
    const std::string half_path = *path_ + "." + std::string(DTypeName(dtype));
    const std::string wide_path = half_path + ".widened";
    ASSERT_TRUE(WriteSafetensors(half_path, half, TestConfig().ToMetadata()).ok());
    auto file = SafetensorsFile::Open(half_path);
    ASSERT_TRUE(file.ok()) << file.status();
    TensorDict wide;
    for (const auto& [name, t] : half.tensors()) {
      wide.Set(name, Tensor::Of<float>(t.shape, *(*file)->ReadF32(name, t.shape)));
    }
    ASSERT_TRUE(WriteSafetensors(wide_path, wide, TestConfig().ToMetadata()).ok());

    std::vector<Generation> expected;
    auto reference = Pipeline::Load(wide_path, 1, std::make_shared<ThreadPool>(1));
    ASSERT_TRUE(reference.ok()) << reference.status();
    for (const auto& prompt : Prompts())
      expected.push_back((*Generate(**reference, {prompt}, Options()))[0]);
    for (int stages : {1, 3}) {
      for (int threads : {1, 3}) {
        auto pipeline = Pipeline::Load(half_path, stages, std::make_shared<ThreadPool>(threads));
        ASSERT_TRUE(pipeline.ok()) << pipeline.status();
        GenerateOptions o = Options();
        o.max_batch = 3;
        ExpectBitwiseEqual(
            expected, *Generate(**pipeline, Prompts(), o),
            StrCat(DTypeName(dtype), ", ", stages, " stages, ", threads, " threads"));
      }
    }
    ::unlink(half_path.c_str());
    ::unlink(wide_path.c_str());
  }
}

}  // namespace
}  // namespace connex::engine
