// config.json and generation_config.json as Hugging Face publishes them: the published configs
// of the named families parse to the right hyper-parameters, and everything the engine would get
// wrong is refused with the key and the value in the message.
#include <map>

#include "connex/engine/hf_model_writer.h"
#include "connex/engine/hf_presets.h"
#include "connex/engine/model_config.h"
#include "connex/engine/rope.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using ::testing::HasSubstr;

// meta-llama/Llama-3.2-1B-Instruct's config.json.
constexpr char kLlama32[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

// Qwen/Qwen2.5-0.5B-Instruct's config.json.
constexpr char kQwen25[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896,
  "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
  "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// mistralai/Mistral-7B-v0.1's config.json.
constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 32000})";

// A Llama 2 long-context fine-tune: the legacy `type` key, no KV-head count, bos null.
constexpr char kLlama2Linear[] = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": null, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "rms_norm_eps": 1e-05, "rope_scaling": {"type": "linear", "factor": 2.0},
  "vocab_size": 32000})";

TEST(HfConfigTest, PublishedConfigsParse) {
  auto llama = ModelConfig::FromJson(kLlama32);
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->model_type, "llama");
  EXPECT_EQ(llama->head_dim(), 64);
  EXPECT_EQ(llama->kv_dim(), 512);
  EXPECT_TRUE(llama->tie_word_embeddings);
  EXPECT_FALSE(llama->qkv_bias);
  EXPECT_EQ(llama->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(llama->eos_token_id(), 128001);
  EXPECT_TRUE(llama->IsEos(128009));
  EXPECT_FALSE(llama->IsEos(128000));
  EXPECT_EQ(llama->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(llama->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(llama->rope_theta, 500000.0);
  EXPECT_EQ(llama->torch_dtype, "bfloat16");
  EXPECT_EQ(llama->max_positions(), 131072);
  // The round trip through our own writer keeps every field.
  EXPECT_EQ(*ModelConfig::FromJson(llama->ToJson()), *llama);

  auto qwen = ModelConfig::FromJson(kQwen25);
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->model_type, "qwen2");
  EXPECT_TRUE(qwen->qkv_bias);
  EXPECT_FALSE(qwen->o_bias);
  EXPECT_EQ(qwen->head_dim(), 64);
  EXPECT_EQ(qwen->sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(qwen->rms_norm_eps, 1e-6);
  EXPECT_EQ(*ModelConfig::FromJson(qwen->ToJson()), *qwen);

  auto mistral = ModelConfig::FromJson(kMistral);
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->sliding_window, 4096);
  EXPECT_FALSE(mistral->tie_word_embeddings);
  EXPECT_EQ(*ModelConfig::FromJson(mistral->ToJson()), *mistral);

  auto linear = ModelConfig::FromJson(kLlama2Linear);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->bos_token_id, -1);
  EXPECT_EQ(linear->num_key_value_heads, 32);  // absent: no grouping
  EXPECT_EQ(linear->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(linear->rope_scaling.factor, 2.0);
}

TEST(HfConfigTest, GenerationConfigOverridesEndTokensAndGivesDefaults) {
  ModelConfig c = *ModelConfig::FromJson(kQwen25);
  ASSERT_TRUE(c.ApplyGenerationConfig(R"({"bos_token_id": 151643, "do_sample": true,
      "eos_token_id": [151645, 151643], "pad_token_id": 151643, "repetition_penalty": 1.1,
      "temperature": 0.7, "top_k": 20, "top_p": 0.8})")
                  .ok());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(c.generation.do_sample, true);
  EXPECT_EQ(c.generation.temperature, 0.7);
  EXPECT_EQ(c.generation.top_k, 20);
  EXPECT_EQ(c.generation.top_p, 0.8);
  EXPECT_EQ(c.generation.repetition_penalty, 1.1);
  EXPECT_FALSE(c.generation.min_p.has_value());
  ModelConfig round = *ModelConfig::FromJson(c.ToJson());
  ASSERT_TRUE(round.ApplyGenerationConfig(c.GenerationConfigJson()).ok());
  EXPECT_EQ(round, c);

  EXPECT_THAT(c.ApplyGenerationConfig(R"({"eos_token_id": [151645, "x"]})").message(),
              HasSubstr("'eos_token_id' [151645,\"x\"] is not an integer or a list"));
  EXPECT_THAT(c.ApplyGenerationConfig(R"({"eos_token_id": 200000})").message(),
              HasSubstr("'eos_token_id' 200000 is outside [0, 'vocab_size' 151936)"));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));  // unchanged on error
  EXPECT_THAT(c.ApplyGenerationConfig("[1]").message(), HasSubstr("not a JSON object"));
  // Sampling defaults a request could not ask for are refused, naming the key and the value.
  EXPECT_THAT(c.ApplyGenerationConfig(R"({"temperature": 3})").message(),
              HasSubstr("generation_config.json: 'temperature' = 3 is outside [0, 2]"));
  EXPECT_THAT(c.ApplyGenerationConfig(R"({"top_p": 0})").message(),
              HasSubstr("'top_p' = 0 is outside (0, 1]"));
  EXPECT_THAT(c.ApplyGenerationConfig(R"({"min_p": 1.5})").message(),
              HasSubstr("'min_p' = 1.5 is outside [0, 1]"));
  EXPECT_THAT(c.ApplyGenerationConfig(R"({"repetition_penalty": 0})").message(),
              HasSubstr("'repetition_penalty' = 0 is outside"));
  EXPECT_THAT(c.ApplyGenerationConfig(R"({"top_k": -5})").message(),
              HasSubstr("'top_k' = -5 is outside"));
  EXPECT_EQ(c.generation.temperature, 0.7);  // unchanged on error
}

// config.json `base` with `patch` merged in (null removes a key).
std::string Patched(const char* base, const char* patch) {
  nlohmann::json j = nlohmann::json::parse(base);
  j.merge_patch(nlohmann::json::parse(patch));
  return j.dump();
}

std::string Refusal(const char* base, const char* patch) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(Patched(base, patch));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << patch;
  return std::string(c.status().message());
}

TEST(HfConfigTest, RefusalsNameTheKeyAndTheValue) {
  EXPECT_THAT(Refusal(kLlama32, R"({"model_type": "gemma", "architectures": null})"),
              HasSubstr("model_type \"gemma\" is not supported (LlamaForCausalLM/llama, "
                        "MistralForCausalLM/mistral, Qwen2ForCausalLM/qwen2)"));
  EXPECT_THAT(Refusal(kLlama32, R"({"model_type": null, "architectures": ["GPT2LMHeadModel"]})"),
              HasSubstr("architectures[0] \"GPT2LMHeadModel\" is not supported"));
  EXPECT_THAT(Refusal(kLlama32, R"({"architectures": ["Qwen2ForCausalLM"]})"),
              HasSubstr("architectures[0] \"Qwen2ForCausalLM\" is not supported"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})"),
              HasSubstr("rope_scaling.rope_type \"yarn\" is not supported (llama3, linear, "
                        "dynamic)"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": {"rope_type": null, "type": "su"}})"),
              HasSubstr("rope_scaling.type \"su\" is not supported"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": {"low_freq_factor": null}})"),
              HasSubstr("rope_scaling.low_freq_factor of rope type \"llama3\" is missing"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": {"rope_type": "dynamic", "factor": 0.5}})"),
              HasSubstr("'rope_scaling.factor' = 0.5 must be in [1, 1024]"));
  EXPECT_THAT(Refusal(kLlama32, R"({"hidden_act": "gelu"})"),
              HasSubstr("hidden_act \"gelu\" is not supported (silu)"));
  EXPECT_THAT(Refusal(kLlama32, R"({"mlp_bias": true})"), HasSubstr("mlp_bias true"));
  EXPECT_THAT(Refusal(kLlama32, R"({"quantization_config": {"quant_method": "awq"}})"),
              HasSubstr("quantization_config {\"quant_method\":\"awq\"} is not supported"));
  EXPECT_THAT(Refusal(kLlama32, R"({"partial_rotary_factor": 0.5})"),
              HasSubstr("partial_rotary_factor 0.5 is not supported"));
  EXPECT_THAT(Refusal(kLlama32, R"({"head_dim": 63})"), HasSubstr("head dimension 63 is odd"));
  EXPECT_THAT(Refusal(kLlama32, R"({"hidden_size": null})"), HasSubstr("'hidden_size' is missing"));
  EXPECT_THAT(Refusal(kLlama32, R"({"num_key_value_heads": 5})"),
              HasSubstr("'num_attention_heads' 32 is not a multiple of 'num_key_value_heads' 5"));
  EXPECT_THAT(Refusal(kLlama32, R"({"eos_token_id": 128256})"),
              HasSubstr("'eos_token_id' 128256 is outside [0, 'vocab_size' 128256)"));
  EXPECT_THAT(Refusal(kLlama32, R"({"eos_token_id": "</s>"})"),
              HasSubstr("'eos_token_id' \"</s>\" is not an integer or a list of integers"));
  EXPECT_THAT(Refusal(kLlama32, R"({"vocab_size": 1.5})"),
              HasSubstr("'vocab_size' 1.5 is not an integer"));
  EXPECT_THAT(Refusal(kQwen25, R"({"use_sliding_window": true})"),
              HasSubstr("use_sliding_window true is not supported for qwen2"));
  EXPECT_THAT(std::string(ModelConfig::FromJson("{").status().message()),
              HasSubstr("config.json is not valid JSON"));
  EXPECT_THAT(Refusal(kLlama32, R"({"model_type": null, "architectures": null})"),
              HasSubstr("neither 'model_type' nor 'architectures' is given"));
  EXPECT_THAT(Refusal(kLlama32, R"({"architectures": ["LlamaForCausalLM", "X"]})"),
              HasSubstr("'architectures' [\"LlamaForCausalLM\",\"X\"] is not a list of one name"));
  EXPECT_THAT(Refusal(kLlama32, R"({"model_type": 7})"),
              HasSubstr("'model_type' 7 is not a string"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": "llama3"})"),
              HasSubstr("'rope_scaling' \"llama3\" is not an object or null"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": {"rope_type": null}})"),
              HasSubstr("has no 'rope_type' (or 'type') string"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": {"factor": "8"}})"),
              HasSubstr("rope_scaling.factor \"8\" is not a number"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": {"original_max_position_embeddings": 0.5}})"),
              HasSubstr("rope_scaling.original_max_position_embeddings 0.5 is not a positive "
                        "integer"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_scaling": {"low_freq_factor": 4.0}})"),
              HasSubstr("'rope_scaling.low_freq_factor' = 4 and 'high_freq_factor' = 4 must "
                        "satisfy 0 < low < high"));
  EXPECT_THAT(Refusal(kLlama32, R"({"tie_word_embeddings": "yes"})"),
              HasSubstr("'tie_word_embeddings' \"yes\" is not true or false"));
  EXPECT_THAT(Refusal(kLlama32, R"({"rope_theta": 1.0})"),
              HasSubstr("'rope_theta' = 1 must be a finite number > 1"));
  // What no config.json can ask for, but a caller of the struct can: refused by Validate.
  ModelConfig c = *ModelConfig::FromJson(kLlama32);
  c.o_bias = true;
  EXPECT_THAT(c.Validate().message(), HasSubstr("model_type \"llama\" with q/k/v biases false "
                                                "and o_proj bias true is no published layout"));
  c = *ModelConfig::FromJson(kLlama32);
  c.sliding_window = 16;
  EXPECT_THAT(c.Validate().message(), HasSubstr("'sliding_window' = 16 is only honoured for "
                                                "mistral"));
}

TEST(HfConfigTest, MistralsWindowAndDynamicScalingBoundTheContext) {
  // A window as long as the context is no window.
  ModelConfig m = *ModelConfig::FromJson(Patched(kMistral, R"({"sliding_window": 32768})"));
  EXPECT_EQ(m.sliding_window, 0);
  m = *ModelConfig::FromJson(Patched(kMistral, R"({"sliding_window": null})"));
  EXPECT_EQ(m.sliding_window, 0);
  ModelConfig d = *ModelConfig::FromJson(Patched(kLlama32, R"({"max_position_embeddings": 4096,
                            "rope_scaling": {"rope_type": "dynamic", "factor": 2.5}})"));
  EXPECT_EQ(d.max_positions(), 10240);
}

// The presets are the published models: their parameter counts are the models' own.
TEST(HfPresetTest, PresetsHaveThePublishedParameterCounts) {
  const std::map<std::string, int64_t> published = {
      {"llama-3.2-1b", 1'235'814'400}, {"llama-3.1-8b", 8'030'261'248},
      {"qwen2.5-0.5b", 494'032'768},   {"tinyllama-1.1b", 1'100'048'384},
      {"smollm-135m", 134'515'008},    {"mistral-7b", 7'241'732'096}};
  std::vector<HfPreset> presets = HfPresets();
  ASSERT_EQ(presets.size(), published.size());
  for (const HfPreset& p : presets) {
    ASSERT_TRUE(p.config.Validate().ok()) << p.name;
    int64_t parameters = 0;
    for (const TensorSpec& spec : HfTensorSpecs(p.config)) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      parameters += n;
    }
    EXPECT_EQ(parameters, published.at(p.name)) << p.name;
    // Its config.json and generation_config.json read back as itself.
    ModelConfig round = *ModelConfig::FromJson(p.config.ToJson());
    ASSERT_TRUE(round.ApplyGenerationConfig(p.config.GenerationConfigJson()).ok());
    EXPECT_TRUE(round == p.config) << p.name << ":\n" << round.ToJson() << p.config.ToJson();
  }
  EXPECT_THAT(std::string(FindHfPreset("gpt2").status().message()),
              HasSubstr("--config \"gpt2\" is no preset (llama-3.2-1b, llama-3.1-8b"));
}

TEST(RopeTest, FrequenciesFollowTheScalingType) {
  ModelConfig c = *ModelConfig::FromJson(kLlama32);
  std::vector<float> llama3 = RopeInverseFrequencies(c, 0);
  ModelConfig plain = c;
  plain.rope_scaling = RopeScaling();
  std::vector<float> none = RopeInverseFrequencies(plain, 0);
  ASSERT_EQ(llama3.size(), 32u);
  // High frequencies (wavelength < 8192 / 4) are kept, low ones (> 8192) divided by 32.
  EXPECT_EQ(llama3[0], none[0]);
  EXPECT_FLOAT_EQ(llama3[31], none[31] / 32);
  EXPECT_FALSE(RopeDependsOnPosition(c));
  EXPECT_EQ(RopeInverseFrequencies(c, 100000), llama3);

  ModelConfig dyn = plain;
  dyn.max_position_embeddings = 100;
  dyn.rope_scaling.type = RopeScaling::Type::kDynamic;
  dyn.rope_scaling.factor = 2.0;
  EXPECT_TRUE(RopeDependsOnPosition(dyn));
  // Within the trained context the frequencies are the plain ones; past it every position has its
  // own, lower ones.
  plain.max_position_embeddings = 100;
  EXPECT_EQ(RopeInverseFrequencies(dyn, 99), RopeInverseFrequencies(plain, 99));
  EXPECT_LT(RopeInverseFrequencies(dyn, 100)[5], RopeInverseFrequencies(dyn, 99)[5]);
  EXPECT_LT(RopeInverseFrequencies(dyn, 150)[5], RopeInverseFrequencies(dyn, 100)[5]);
  EXPECT_EQ(RopeInverseFrequencies(dyn, 100)[0], 1.0f);  // frequency 0 is the base's power 0
}

}  // namespace
}  // namespace connex::engine
