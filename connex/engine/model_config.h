// The hyper-parameters of a Llama-architecture model, with Hugging Face's config.json names, and
// how they are carried in a checkpoint: as strings in the safetensors `__metadata__` (one file
// holds the whole model), or in a config.json beside the file. Thread-compatible (value type).
#ifndef CONNEX_ENGINE_MODEL_CONFIG_H_
#define CONNEX_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace connex::engine {

struct ModelConfig {
  int64_t vocab_size = 258;   // 256 byte tokens + BOS + EOS
  int64_t hidden_size = 512;  // model dimension
  int64_t num_hidden_layers = 8;
  int64_t num_attention_heads = 8;
  int64_t num_key_value_heads = 2;   // grouped-query attention
  int64_t intermediate_size = 1024;  // SwiGLU width
  int64_t max_position_embeddings = 4096;
  int64_t bos_token_id = 256;
  int64_t eos_token_id = 257;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t kv_dim() const { return head_dim() * num_key_value_heads; }

  // InvalidArgument naming the first inconsistent field.
  absl::Status Validate() const;

  // The range [min, max] that Validate accepts for integer field `name` (a config.json key such
  // as "hidden_size"); for range-checking a flag that sets it. `name` must be a field.
  static std::pair<int64_t, int64_t> FieldRange(std::string_view name);

  // The `__metadata__` form: every field as a decimal string, plus "format": "connex-llama".
  std::map<std::string, std::string, std::less<>> ToMetadata() const;
  static absl::StatusOr<ModelConfig> FromMetadata(
      const std::map<std::string, std::string, std::less<>>& metadata);

  // The config.json form (Hugging Face's LlamaConfig keys; others are ignored).
  std::string ToJson() const;
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json);

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
