// The hyper-parameters of a Llama-family model (Llama 2/3/3.1/3.2, Mistral, TinyLlama, SmolLM,
// Qwen2/2.5), with Hugging Face's config.json names, and how they are carried in a checkpoint: in
// a config.json (+ generation_config.json) beside the weights, as Hugging Face publishes a model,
// or as strings in the safetensors `__metadata__` (connex-mkmodel's one-file test models).
// Thread-compatible (value type).
#ifndef CONNEX_ENGINE_MODEL_CONFIG_H_
#define CONNEX_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace connex::engine {

// config.json's `rope_scaling` (the key `rope_type`, or the legacy `type`).
struct RopeScaling {
  enum class Type { kNone, kLinear, kDynamic, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  // llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;

  bool operator==(const RopeScaling&) const = default;
};

// generation_config.json's sampling defaults (absent keys stay unset). A server started with
// `--generation-config auto` gives a request that omits a sampling field the value here, as vLLM
// does (do_sample is read but, as in vLLM, not applied: temperature says whether to sample).
struct GenerationDefaults {
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;

  bool operator==(const GenerationDefaults&) const = default;
};

struct ModelConfig {
  // "llama" (LlamaForCausalLM), "mistral" (MistralForCausalLM) or "qwen2" (Qwen2ForCausalLM).
  std::string model_type = "llama";
  int64_t vocab_size = 258;   // 256 byte tokens + BOS + EOS
  int64_t hidden_size = 512;  // model dimension
  int64_t num_hidden_layers = 8;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 2;   // grouped-query attention
  int64_t intermediate_size = 1024;  // SwiGLU width
  int64_t max_position_embeddings = 4096;
  int64_t bos_token_id = 256;  // -1: none (config.json's null)
  // Every token that ends a generation (config.json's int or list; generation_config.json's
  // wins); the first is the one a single-token consumer uses.
  std::vector<int64_t> eos_token_ids = {257};
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  // config.json's `head_dim`; 0: hidden_size / num_attention_heads.
  int64_t explicit_head_dim = 0;
  RopeScaling rope_scaling;
  // The LM head is model.embed_tokens.weight (the checkpoint has no lm_head.weight).
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // q/k/v_proj have a bias (Qwen2; Llama's attention_bias)
  bool o_bias = false;    // o_proj has a bias (Llama's attention_bias)
  // > 0: a query attends to the last `sliding_window` positions only (itself included), as
  // Mistral's; 0: every earlier position.
  int64_t sliding_window = 0;
  std::string torch_dtype;  // informational: the published weights' dtype
  GenerationDefaults generation;

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  int64_t q_dim() const { return head_dim() * num_attention_heads; }
  int64_t kv_dim() const { return head_dim() * num_key_value_heads; }
  // The first end token, -1 when there is none.
  int64_t eos_token_id() const { return eos_token_ids.empty() ? -1 : eos_token_ids.front(); }
  bool IsEos(int64_t token) const;
  // The longest sequence a request may reach: max_position_embeddings, or for dynamic NTK
  // scaling max_position_embeddings × factor (the lengths the rescaled frequencies are for).
  int64_t max_positions() const;

  // InvalidArgument naming the first inconsistent field.
  absl::Status Validate() const;

  // The range [min, max] that Validate accepts for integer field `name` (a config.json key such
  // as "hidden_size"); for range-checking a flag that sets it. `name` must be a field.
  static std::pair<int64_t, int64_t> FieldRange(std::string_view name);

  // The `__metadata__` form: the Llama fields as decimal strings plus "format": "pt". It carries
  // neither a tied head, biases, rope scaling nor several end tokens: such a model needs
  // config.json (ToMetadata's caller checks HasMetadataForm()).
  bool HasMetadataForm() const;
  std::map<std::string, std::string, std::less<>> ToMetadata() const;
  static absl::StatusOr<ModelConfig> FromMetadata(
      const std::map<std::string, std::string, std::less<>>& metadata);

  // Hugging Face's config.json. FromJson refuses what the engine cannot run faithfully (another
  // architecture, activation or rope type, Qwen2's sliding window), naming the key and value.
  std::string ToJson() const;
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json);
  // generation_config.json: bos/eos ids and the sampling defaults.
  std::string GenerationConfigJson() const;
  absl::Status ApplyGenerationConfig(std::string_view json);

  bool operator==(const ModelConfig&) const = default;
};

// Layers [begin, end) of stage `stage` of `stages`: contiguous, balanced (sizes differ by at most
// one), in order.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
};
LayerRange StageLayers(int64_t num_layers, int stage, int stages);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_MODEL_CONFIG_H_
