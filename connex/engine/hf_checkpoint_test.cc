// Hugging Face model directories end to end in the engine: sharded checkpoints through their
// index (each stage opens only the shards of its tensors, the last stage of a tied model the
// embedding's), the index's and the weights' errors named, max_positions enforced, sane
// activations through many layers of random weights, and bitwise-identical logits and tokens
// across 1, 2 and 3 stages, batches, chunked prefill and recompute on HF-layout models.
#include <cstring>
#include <fstream>
#include <set>

#include "connex/engine/checkpoint.h"
#include "connex/engine/generator.h"
#include "connex/engine/hf_model_writer.h"
#include "connex/engine/hf_presets.h"
#include "connex/engine/hf_test_util.h"
#include "connex/engine/pipeline.h"
#include "gmock/gmock.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using ::testing::HasSubstr;
using testing_hf::PromptTokens;
using testing_hf::StageAt;
using testing_hf::TempDir;
using testing_hf::TinyHfConfig;

HfModelOptions Options(DType dtype, uint64_t shard_size) {
  HfModelOptions o;
  o.seed = 5;
  o.dtype = dtype;
  o.shard_size = shard_size;
  return o;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

TEST(HfCheckpointTest, EachStageOpensOnlyTheShardsOfItsTensors) {
  TempDir dir;
  ModelConfig c = TinyHfConfig();
  c.tie_word_embeddings = true;
  auto written = WriteRandomHfModel(dir.path(), c, Options(DType::kF32, 50'000));
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_GT(written->files.size(), 6u);
  nlohmann::json index = ReadJson(dir / kIndexFile);
  EXPECT_EQ(index["metadata"]["total_size"], written->bytes);
  EXPECT_FALSE(index["weight_map"].contains("lm_head.weight"));  // tied

  for (int stages : {1, 2, 3}) {
    for (int s = 0; s < stages; ++s) {
      auto engine = StageEngine::Load(dir.path(), StageAt(s, stages));
      ASSERT_TRUE(engine.ok()) << engine.status();
      // The shards the stage needs, from the index: its layers', the embedding's on stage 0 and
      // (tied) on the last stage, the final norm's on the last.
      std::set<std::string> needed;
      const LayerRange layers = (*engine)->layers();
      for (const auto& [name, file] : index["weight_map"].items()) {
        bool mine = false;
        if (name.rfind("model.layers.", 0) == 0) {
          const int64_t layer = std::stoll(name.substr(13));
          mine = layer >= layers.begin && layer < layers.end;
        } else if (name == "model.embed_tokens.weight") {
          mine = s == 0 || s == stages - 1;
        } else {
          mine = s == stages - 1;
        }
        if (mine) needed.insert(file.get<std::string>());
      }
      std::vector<std::string> opened = (*engine)->checkpoint().OpenedShards();
      EXPECT_EQ(std::set<std::string>(opened.begin(), opened.end()), needed)
          << "stage " << s << " of " << stages;
      if (stages == 3) {
        EXPECT_LT(opened.size(), written->files.size());
      }
    }
  }
}

TEST(HfCheckpointTest, LayoutsLoadAndGenerate) {
  // Each preset's layout (tied or not, biases, explicit head_dim, window, rope type), shrunk to
  // 2 layers of hidden 64 and a vocabulary of 512, in each dtype and sharded or not.
  for (const HfPreset& preset : HfPresets()) {
    for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      ModelConfig c = preset.config;
      c.num_hidden_layers = 2;
      c.hidden_size = 64;
      c.num_attention_heads = 4;
      c.num_key_value_heads = 2;
      c.explicit_head_dim = c.explicit_head_dim > 0 ? 24 : 0;
      c.intermediate_size = 96;
      c.vocab_size = 512;
      c.bos_token_id = c.bos_token_id >= 0 ? 1 : -1;
      c.eos_token_ids = {2, 3};
      TempDir dir;
      const uint64_t shard = dtype == DType::kF32 ? 60'000 : uint64_t{1} << 30;
      auto written = WriteRandomHfModel(dir.path(), c, Options(dtype, shard));
      ASSERT_TRUE(written.ok()) << preset.name << ": " << written.status();
      auto pipeline = Pipeline::Load(dir.path(), 2, std::make_shared<ThreadPool>(1));
      ASSERT_TRUE(pipeline.ok()) << preset.name << ": " << pipeline.status();
      EXPECT_EQ((*pipeline)->config().model_type, c.model_type);
      EXPECT_EQ((*pipeline)->config().tie_word_embeddings, c.tie_word_embeddings);
      GenerateOptions o;
      o.max_tokens = 6;
      o.stop_at_eos = false;
      auto g = Generate(**pipeline, {PromptTokens(9, 512)}, o);
      ASSERT_TRUE(g.ok()) << preset.name << ": " << g.status();
      EXPECT_EQ((*g)[0].tokens.size(), 6u) << preset.name;
    }
  }
}

TEST(HfCheckpointTest, CheckpointErrorsNameTheFileAndTheTensor) {
  ModelConfig c = TinyHfConfig();
  TempDir dir;
  ASSERT_TRUE(WriteRandomHfModel(dir.path(), c, Options(DType::kBF16, 50'000)).ok());
  nlohmann::json index = ReadJson(dir / kIndexFile);
  auto load = [&](int stage = 0, int stages = 1) {
    return std::string(StageEngine::Load(dir.path(), StageAt(stage, stages)).status().message());
  };
  auto write_index = [&](const nlohmann::json& j) { std::ofstream(dir / kIndexFile) << j.dump(); };

  // Untied: the head is needed, and named when the index lacks it.
  nlohmann::json broken = index;
  const std::string head_file = broken["weight_map"]["lm_head.weight"];
  broken["weight_map"].erase("lm_head.weight");
  write_index(broken);
  EXPECT_THAT(load(),
              HasSubstr("model.safetensors.index.json: tensor 'lm_head.weight' is missing"));
  EXPECT_TRUE(StageEngine::Load(dir.path(), StageAt(0, 2)).ok());  // stage 0 has no head

  // The index puts a tensor in a shard that does not hold it.
  broken = index;
  const std::string other = index["weight_map"]["model.embed_tokens.weight"];
  broken["weight_map"]["lm_head.weight"] = other;
  write_index(broken);
  EXPECT_THAT(load(), HasSubstr(other + ": tensor 'lm_head.weight' is missing (model.safetensors."
                                        "index.json puts it there)"));

  broken["weight_map"]["lm_head.weight"] = "model-99999-of-99999.safetensors";
  write_index(broken);
  EXPECT_THAT(load(), HasSubstr("shard \"model-99999-of-99999.safetensors\" (of tensor "
                                "'lm_head.weight') does not exist"));
  broken["weight_map"]["lm_head.weight"] = "../" + head_file;
  write_index(broken);
  EXPECT_THAT(load(), HasSubstr("is not a file name beside the index"));
  write_index(nlohmann::json{{"metadata", {}}});
  EXPECT_THAT(load(), HasSubstr("'weight_map' is missing or empty"));

  // A shard of the wrong shape for the config.
  write_index(index);
  nlohmann::json config = ReadJson(dir / "config.json");
  config["intermediate_size"] = 100;
  std::ofstream(dir / "config.json") << config.dump();
  EXPECT_THAT(load(), HasSubstr("'model.layers.0.mlp.gate_proj.weight' has shape [96, 64], "
                                "expected [100, 64]"));
  config["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2}};
  std::ofstream(dir / "config.json") << config.dump();
  EXPECT_THAT(load(), HasSubstr("config.json: rope_scaling.rope_type \"longrope\" is not "
                                "supported (llama3, linear, dynamic)"));
  ::unlink((dir / "config.json").c_str());
  EXPECT_THAT(load(), HasSubstr("no model config"));

  TempDir empty;
  EXPECT_EQ(StageEngine::Load(empty.path(), StageAt(0, 1)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(StageEngine::Load(empty.path(), StageAt(0, 1)).status().message()),
              HasSubstr("neither model.safetensors.index.json nor model.safetensors"));
}

TEST(HfCheckpointTest, RequestsPastTheContextAreRefused) {
  ModelConfig c = TinyHfConfig();
  c.max_position_embeddings = 20;
  TempDir dir;
  ASSERT_TRUE(WriteRandomHfModel(dir.path(), c, Options(DType::kBF16, uint64_t{1} << 30)).ok());
  auto pipeline = Pipeline::Load(dir.path(), 1, std::make_shared<ThreadPool>(1));
  ASSERT_TRUE(pipeline.ok());
  GenerateOptions o;
  o.max_tokens = 6;
  EXPECT_TRUE(Generate(**pipeline, {PromptTokens(15, 300)}, o).ok());  // 15 + 6 - 1 = 20
  auto g = Generate(**pipeline, {PromptTokens(16, 300)}, o);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(g.status().message()),
              HasSubstr("prompt 0: 16 tokens and up to 6 generated need 21 positions, more than "
                        "the model's 20 (max_position_embeddings)"));
  // A step that would pass it, sent directly, is refused by the stage.
  TensorDict step;
  pp::SetBatch(step, {1}, {18}, {3});
  step.Set(kTokens, Tensor::Of<int32_t>({3}, std::vector<int32_t>{5, 6, 7}));
  EXPECT_THAT(std::string((*pipeline)->Step(step).status().message()),
              HasSubstr("positions [18, 21) are outside [0, 20)"));

  // Dynamic scaling stretches the context by its factor.
  c.rope_scaling.type = RopeScaling::Type::kDynamic;
  c.rope_scaling.factor = 2.0;
  TempDir dyn;
  ASSERT_TRUE(WriteRandomHfModel(dyn.path(), c, Options(DType::kBF16, uint64_t{1} << 30)).ok());
  pipeline = Pipeline::Load(dyn.path(), 1, std::make_shared<ThreadPool>(1));
  ASSERT_TRUE(pipeline.ok());
  EXPECT_TRUE(Generate(**pipeline, {PromptTokens(35, 300)}, o).ok());
  EXPECT_THAT(std::string(Generate(**pipeline, {PromptTokens(36, 300)}, o).status().message()),
              HasSubstr("more than the model's 40 (max_position_embeddings x "
                        "rope_scaling.factor)"));
}

TEST(HfCheckpointTest, RandomWeightsStaySaneThroughManyLayers) {
  // SmolLM's depth (30 layers) and grouping at a small width, BF16, tied.
  ModelConfig c = FindHfPreset("smollm-135m")->config;
  c.hidden_size = 96;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.intermediate_size = 256;
  c.vocab_size = 1000;
  c.eos_token_ids = {};
  TempDir dir;
  ASSERT_TRUE(WriteRandomHfModel(dir.path(), c, Options(DType::kBF16, uint64_t{1} << 30)).ok());
  auto pipeline = Pipeline::Load(dir.path(), 1, std::make_shared<ThreadPool>(2));
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  GenerateOptions o;
  o.max_tokens = 32;
  o.keep_logits = true;
  auto g = Generate(**pipeline, {PromptTokens(5, 1000, 1), PromptTokens(5, 1000, 2)}, o);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const Generation& gen : *g) {
    std::set<int32_t> distinct(gen.tokens.begin(), gen.tokens.end());
    EXPECT_GE(distinct.size(), 12u) << "the generation loops on a few tokens";
    for (const std::vector<float>& row : gen.logits) {
      float max_abs = 0;
      for (float x : row) {
        ASSERT_TRUE(std::isfinite(x));
        max_abs = std::max(max_abs, std::fabs(x));
      }
      EXPECT_LT(max_abs, 50.0f);
      EXPECT_GT(max_abs, 0.5f);
    }
  }
  EXPECT_NE((*g)[0].tokens, (*g)[1].tokens);
}

// Bitwise invariance on HF-layout models: the features whose arithmetic is new (biases, tied
// head from another shard, explicit head_dim, position-dependent dynamic RoPE, the window).
class HfInvarianceTest : public testing::TestWithParam<std::string> {};

ModelConfig InvarianceConfig(const std::string& name) {
  if (name == "qwen2_tied_bf16") {
    ModelConfig c = TinyHfConfig("qwen2");
    c.tie_word_embeddings = true;
    c.explicit_head_dim = 24;
    return c;
  }
  if (name == "llama_dynamic_rope") {
    ModelConfig c = TinyHfConfig();
    c.max_position_embeddings = 12;  // decoding runs past it: per-position frequencies
    c.rope_scaling.type = RopeScaling::Type::kDynamic;
    c.rope_scaling.factor = 4.0;
    return c;
  }
  ModelConfig c = TinyHfConfig("mistral");
  c.sliding_window = 5;
  return c;
}

void ExpectSame(const std::vector<Generation>& a, const std::vector<Generation>& b,
                const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << ", prompt " << i;
    ASSERT_EQ(a[i].logits.size(), b[i].logits.size()) << what;
    for (size_t s = 0; s < a[i].logits.size(); ++s) {
      ASSERT_EQ(a[i].logits[s].size(), b[i].logits[s].size());
      EXPECT_EQ(std::memcmp(a[i].logits[s].data(), b[i].logits[s].data(),
                            a[i].logits[s].size() * sizeof(float)),
                0)
          << what << ": logits of prompt " << i << ", token " << s;
    }
  }
}

TEST_P(HfInvarianceTest, StagesBatchesChunksAndRecomputeAreBitwiseIdentical) {
  TempDir dir;
  ASSERT_TRUE(
      WriteRandomHfModel(dir.path(), InvarianceConfig(GetParam()), Options(DType::kBF16, 40'000))
          .ok());
  const std::vector<std::vector<int32_t>> prompts = {
      PromptTokens(9, 300, 1), PromptTokens(3, 300, 2), PromptTokens(14, 300, 3),
      PromptTokens(1, 300, 4)};
  GenerateOptions o;
  o.max_tokens = 10;
  o.stop_at_eos = false;
  o.keep_logits = true;
  auto one = Pipeline::Load(dir.path(), 1, std::make_shared<ThreadPool>(1));
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<Generation> alone;
  for (const auto& p : prompts) alone.push_back((*Generate(**one, {p}, o))[0]);
  for (int stages : {1, 2, 3}) {
    for (int threads : {1, 3}) {
      auto pipeline = Pipeline::Load(dir.path(), stages, std::make_shared<ThreadPool>(threads));
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      const std::string what = GetParam() + ", " + std::to_string(stages) + " stages, " +
                               std::to_string(threads) + " threads";
      GenerateOptions batched = o;
      batched.max_batch = 3;
      ExpectSame(alone, *Generate(**pipeline, prompts, batched), what + ", batched");
      GenerateOptions chunked = o;
      chunked.prefill_chunk = 4;
      chunked.recompute_at = 3;
      ExpectSame(alone, *Generate(**pipeline, prompts, chunked), what + ", chunked + recompute");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HfInvarianceTest,
                         testing::Values("qwen2_tied_bf16", "llama_dynamic_rope",
                                         "mistral_sliding_window"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace connex::engine
