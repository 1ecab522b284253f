// The engine against a float64 numpy forward pass (testdata/llama_reference.py, written from the
// transformers definitions) on tiny models in Hugging Face's layout, one per feature: plain
// Llama, tied + sharded + BF16, F16 with an explicit head_dim, Llama's attention biases, Qwen2's
// q/k/v biases, each rope_scaling type, Mistral's sliding window. Each case also runs the
// reference without its feature and checks that the engine is far from that: the comparison
// would notice the feature missing or wrong.
#include <cstdio>
#include <fstream>

#include "connex/base/strings.h"
#include "connex/engine/generator.h"
#include "connex/engine/hf_model_writer.h"
#include "connex/engine/hf_test_util.h"
#include "connex/engine/pipeline.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using testing_hf::PromptTokens;
using testing_hf::TempDir;
using testing_hf::TinyHfConfig;

struct Case {
  std::string name;
  ModelConfig config;
  DType dtype = DType::kF32;
  uint64_t shard_size = uint64_t{1} << 40;
  std::string ablate;  // the feature the reference drops to show it matters ("": none)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr uint64_t kOneFile = uint64_t{1} << 40;

Case Make(std::string name, ModelConfig config, DType dtype = DType::kF32,
          uint64_t shard_size = kOneFile, std::string ablate = "") {
  Case c;
  c.name = std::move(name);
  c.config = std::move(config);
  c.dtype = dtype;
  c.shard_size = shard_size;
  c.ablate = std::move(ablate);
  return c;
}

RopeScaling Scaling(RopeScaling::Type type, double factor) {
  RopeScaling r;
  r.type = type;
  r.factor = factor;
  return r;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back(Make("llama", TinyHfConfig()));
  {
    Case c = Make("tied_sharded_bf16", TinyHfConfig(), DType::kBF16, 40'000);
    c.config.tie_word_embeddings = true;
    cases.push_back(c);
  }
  {
    Case c = Make("f16_explicit_head_dim", TinyHfConfig(), DType::kF16);
    c.config.explicit_head_dim = 24;  // q: 96 wide, hidden 64
    cases.push_back(c);
  }
  {
    Case c = Make("llama_attention_bias", TinyHfConfig(), DType::kF32, kOneFile, "bias");
    c.config.qkv_bias = c.config.o_bias = true;
    cases.push_back(c);
  }
  {
    Case c = Make("qwen2_biases_tied", TinyHfConfig("qwen2"), DType::kBF16, 60'000, "bias");
    c.config.tie_word_embeddings = true;
    c.config.rope_theta = 1e6;
    cases.push_back(c);
  }
  {
    Case c = Make("rope_llama3", TinyHfConfig(), DType::kF32, kOneFile, "rope_scaling");
    c.config.rope_scaling = Scaling(RopeScaling::Type::kLlama3, 8.0);
    c.config.rope_scaling.original_max_position_embeddings = 16;
    cases.push_back(c);
  }
  {
    Case c = Make("rope_linear", TinyHfConfig(), DType::kF32, kOneFile, "rope_scaling");
    c.config.rope_scaling = Scaling(RopeScaling::Type::kLinear, 4.0);
    cases.push_back(c);
  }
  {
    // Positions 16.. are past max_position_embeddings: each gets its own base.
    Case c = Make("rope_dynamic", TinyHfConfig(), DType::kF32, kOneFile, "rope_scaling");
    c.config.max_position_embeddings = 16;
    c.config.rope_scaling = Scaling(RopeScaling::Type::kDynamic, 4.0);
    cases.push_back(c);
  }
  {
    Case c =
        Make("mistral_sliding_window", TinyHfConfig("mistral"), DType::kF32, kOneFile, "window");
    c.config.sliding_window = 8;
    cases.push_back(c);
  }
  return cases;
}

bool HaveNumpy() { return std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") == 0; }

// The reference's logits of the last `rows` positions of `tokens`.
std::vector<std::vector<double>> Reference(const std::string& dir,
                                           const std::vector<int32_t>& tokens, int rows,
                                           const std::string& ablate) {
  const std::string tokens_file = dir + "/tokens.json";
  std::ofstream(tokens_file) << nlohmann::json(tokens).dump();
  std::string cmd = StrCat("/usr/bin/python3 ", CONNEX_ENGINE_TESTDATA, "/llama_reference.py ", dir,
                           " ", tokens_file, " ", rows);
  if (!ablate.empty()) cmd += " --ablate " + ablate;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {};
  std::string out;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {};
  return j["logits"].get<std::vector<std::vector<double>>>();
}

class HfReferenceTest : public testing::TestWithParam<Case> {};

TEST_P(HfReferenceTest, EngineMatchesNumpyReference) {
  if (!HaveNumpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy is needed";
  const Case& c = GetParam();
  TempDir dir;
  HfModelOptions options;
  options.seed = 11;
  options.dtype = c.dtype;
  options.shard_size = c.shard_size;
  auto written = WriteRandomHfModel(dir.path(), c.config, options);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->files.size() > 1, c.shard_size < 100'000) << "sharded as asked";

  for (int stages : {1, 2}) {
    auto pipeline = Pipeline::Load(dir.path(), stages, std::make_shared<ThreadPool>(2));
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    EXPECT_EQ((*pipeline)->config(), *ReadModelConfig(dir.path()));
    const std::vector<int32_t> prompt = PromptTokens(30, c.config.vocab_size);
    GenerateOptions o;
    o.max_tokens = 4;
    o.stop_at_eos = false;
    o.keep_logits = true;
    auto g = Generate(**pipeline, {prompt}, o);
    ASSERT_TRUE(g.ok()) << g.status();
    const Generation& gen = (*g)[0];
    // Rows: the logits after the prompt and after each of the first three generated tokens.
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), gen.tokens.begin(), gen.tokens.end() - 1);
    const std::vector<std::vector<double>> expected = Reference(dir.path(), tokens, 4, "");
    ASSERT_EQ(expected.size(), 4u);
    double max_err = 0, spread = 0;
    for (size_t r = 0; r < 4; ++r) {
      ASSERT_EQ(expected[r].size(), gen.logits[r].size());
      for (size_t i = 0; i < expected[r].size(); ++i) {
        const double e = expected[r][i], got = gen.logits[r][i];
        ASSERT_TRUE(std::isfinite(got)) << c.name << ": row " << r << ", logit " << i;
        max_err = std::max(max_err, std::fabs(got - e) / (1 + std::fabs(e)));
        spread = std::max(spread, std::fabs(e - expected[r][0]));
      }
    }
    // fp32 against float64: 3e-6 to 1.6e-5 is what the engine reaches on these models.
    EXPECT_LT(max_err, 1e-4) << c.name << ", " << stages << " stage(s)";
    EXPECT_GT(spread, 0.5) << c.name << ": the logits carry information";
    if (c.ablate.empty() || stages > 1) continue;
    const std::vector<std::vector<double>> without = Reference(dir.path(), tokens, 4, c.ablate);
    ASSERT_EQ(without.size(), 4u);
    double off = 0;
    for (size_t r = 0; r < 4; ++r) {
      for (size_t i = 0; i < without[r].size(); ++i) {
        off = std::max(
            off, std::fabs(gen.logits[r][i] - without[r][i]) / (1 + std::fabs(without[r][i])));
      }
    }
    EXPECT_GT(off, 1e-2) << c.name << ": the reference without " << c.ablate
                         << " is as close, the test would not notice it missing";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HfReferenceTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace connex::engine
