#include "connex/engine/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/numbers.h"
#include "connex/base/check.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::engine {
namespace {

struct IntField {
  const char* name;
  int64_t ModelConfig::*field;
  int64_t min;
  int64_t max;
};

constexpr int64_t kMaxVocab = 1 << 20;

constexpr IntField kIntFields[] = {
    {"vocab_size", &ModelConfig::vocab_size, 258, kMaxVocab},
    {"hidden_size", &ModelConfig::hidden_size, 2, 1 << 16},
    {"num_hidden_layers", &ModelConfig::num_hidden_layers, 1, 1024},
    {"num_attention_heads", &ModelConfig::num_attention_heads, 1, 1024},
    {"num_key_value_heads", &ModelConfig::num_key_value_heads, 1, 1024},
    {"intermediate_size", &ModelConfig::intermediate_size, 1, 1 << 18},
    {"max_position_embeddings", &ModelConfig::max_position_embeddings, 1, 1 << 20},
    {"bos_token_id", &ModelConfig::bos_token_id, -1, kMaxVocab - 1},
    {"head_dim", &ModelConfig::explicit_head_dim, 0, 1 << 12},
    {"sliding_window", &ModelConfig::sliding_window, 0, 1 << 20},
};

struct RealField {
  const char* name;
  double ModelConfig::*field;
};

constexpr RealField kRealFields[] = {
    {"rope_theta", &ModelConfig::rope_theta},
    {"rms_norm_eps", &ModelConfig::rms_norm_eps},
};

// The fields of the one-file `__metadata__` form (connex-mkmodel's test models).
constexpr const char* kMetadataInts[] = {
    "vocab_size",          "hidden_size",       "num_hidden_layers",       "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "max_position_embeddings", "bos_token_id"};

absl::Status ConfigError(std::string_view what) {
  return absl::InvalidArgumentError(StrCat("model config: ", what));
}

const IntField& IntFieldNamed(std::string_view name) {
  for (const IntField& f : kIntFields) {
    if (name == f.name) return f;
  }
  CONNEX_CHECK(false && "no integer field of ModelConfig has this name");
  return kIntFields[0];
}

absl::Status ValidateRopeScaling(const RopeScaling& r) {
  using Type = RopeScaling::Type;
  if (r.type == Type::kNone) return absl::OkStatus();
  // Linear scaling may compress or stretch; dynamic and llama3 only stretch (HF warns below 1).
  const bool linear = r.type == Type::kLinear;
  if (!std::isfinite(r.factor) || !(linear ? r.factor > 0 : r.factor >= 1) || r.factor > 1024) {
    return ConfigError(StrCat("'rope_scaling.factor' = ", r.factor, " must be in ",
                              linear ? "(0" : "[1", ", 1024]"));
  }
  if (r.type != Type::kLlama3) return absl::OkStatus();
  if (r.original_max_position_embeddings < 1 || r.original_max_position_embeddings > (1 << 24)) {
    return ConfigError(StrCat(
        "'rope_scaling.original_max_position_embeddings' = ", r.original_max_position_embeddings,
        " must be in [1, ", 1 << 24, "]"));
  }
  if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor) ||
      !std::isfinite(r.high_freq_factor)) {
    return ConfigError(StrCat("'rope_scaling.low_freq_factor' = ", r.low_freq_factor,
                              " and 'high_freq_factor' = ", r.high_freq_factor,
                              " must satisfy 0 < low < high"));
  }
  return absl::OkStatus();
}

}  // namespace

bool ModelConfig::IsEos(int64_t token) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

int64_t ModelConfig::max_positions() const {
  if (rope_scaling.type != RopeScaling::Type::kDynamic) return max_position_embeddings;
  const double n = std::floor(static_cast<double>(max_position_embeddings) * rope_scaling.factor);
  return static_cast<int64_t>(std::min(n, static_cast<double>(1 << 24)));
}

namespace {

// generation_config.json's sampling defaults: what the API would accept in a request.
absl::Status ValidateGenerationDefaults(const GenerationDefaults& g) {
  auto bad = [](std::string_view key, double v, std::string_view range) {
    return ConfigError(StrCat("generation_config.json: '", key, "' = ", v, " is outside ", range));
  };
  if (g.temperature && !(*g.temperature >= 0 && *g.temperature <= 2)) {
    return bad("temperature", *g.temperature, "[0, 2]");
  }
  if (g.top_p && !(*g.top_p > 0 && *g.top_p <= 1)) return bad("top_p", *g.top_p, "(0, 1]");
  if (g.top_k && !(*g.top_k >= -1 && *g.top_k <= std::numeric_limits<int32_t>::max())) {
    return bad("top_k", static_cast<double>(*g.top_k), "-1 (none), 0 (none) or >= 1");
  }
  if (g.min_p && !(*g.min_p >= 0 && *g.min_p <= 1)) return bad("min_p", *g.min_p, "[0, 1]");
  if (g.repetition_penalty &&
      !(*g.repetition_penalty > 0 && *g.repetition_penalty <= std::numeric_limits<float>::max())) {
    return bad("repetition_penalty", *g.repetition_penalty, "(0, FLT_MAX] (1: none)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  if (model_type != "llama" && model_type != "mistral" && model_type != "qwen2") {
    return ConfigError(
        StrCat("'model_type' \"", model_type, "\" is not supported (llama, mistral, qwen2)"));
  }
  for (const IntField& f : kIntFields) {
    int64_t v = this->*f.field;
    if (v < f.min || v > f.max) {
      return ConfigError(
          StrCat("'", f.name, "' = ", v, " is out of range [", f.min, ", ", f.max, "]"));
    }
  }
  if (explicit_head_dim == 0 && hidden_size % num_attention_heads != 0) {
    return ConfigError(StrCat("'hidden_size' ", hidden_size,
                              " is not a multiple of 'num_attention_heads' ", num_attention_heads,
                              " (and no 'head_dim' is given)"));
  }
  if (head_dim() % 2 != 0)
    return ConfigError(StrCat("head dimension ", head_dim(), " is odd (RoPE)"));
  if (num_attention_heads % num_key_value_heads != 0) {
    return ConfigError(StrCat("'num_attention_heads' ", num_attention_heads,
                              " is not a multiple of 'num_key_value_heads' ", num_key_value_heads));
  }
  if (bos_token_id >= vocab_size) {
    return ConfigError(
        StrCat("'bos_token_id' ", bos_token_id, " must be < 'vocab_size' ", vocab_size));
  }
  for (int64_t eos : eos_token_ids) {
    if (eos < 0 || eos >= vocab_size) {
      return ConfigError(
          StrCat("'eos_token_id' ", eos, " is outside [0, 'vocab_size' ", vocab_size, ")"));
    }
  }
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta)) {
    return ConfigError(StrCat("'rope_theta' = ", rope_theta, " must be a finite number > 1"));
  }
  if (!(rms_norm_eps > 0.0) || !(rms_norm_eps < 1.0)) {
    return ConfigError(StrCat("'rms_norm_eps' = ", rms_norm_eps, " must be in (0, 1)"));
  }
  CONNEX_RETURN_IF_ERROR(ValidateRopeScaling(rope_scaling));
  CONNEX_RETURN_IF_ERROR(ValidateGenerationDefaults(generation));
  // What each architecture has: Qwen2 q/k/v biases always, Llama all four or none, Mistral none.
  if (model_type == "qwen2" ? (!qkv_bias || o_bias)
                            : (o_bias != qkv_bias || (model_type == "mistral" && qkv_bias))) {
    return ConfigError(StrCat("model_type \"", model_type, "\" with q/k/v biases ", qkv_bias,
                              " and o_proj bias ", o_bias, " is no published layout"));
  }
  if (sliding_window > 0 && model_type != "mistral") {
    return ConfigError(
        StrCat("'sliding_window' = ", sliding_window, " is only honoured for mistral"));
  }
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> ModelConfig::FieldRange(std::string_view name) {
  const IntField& f = IntFieldNamed(name);
  return {f.min, f.max};
}

bool ModelConfig::HasMetadataForm() const {
  ModelConfig plain;
  return model_type == plain.model_type && explicit_head_dim == 0 && eos_token_ids.size() == 1 &&
         bos_token_id >= 0 && rope_scaling == plain.rope_scaling && !tie_word_embeddings &&
         !qkv_bias && !o_bias && sliding_window == 0;
}

std::map<std::string, std::string, std::less<>> ModelConfig::ToMetadata() const {
  CONNEX_CHECK(HasMetadataForm());
  std::map<std::string, std::string, std::less<>> m;
  m["format"] = "pt";  // what Hugging Face's loaders expect
  m["architecture"] = "LlamaForCausalLM";
  for (const char* name : kMetadataInts) m[name] = StrCat(this->*IntFieldNamed(name).field);
  m["eos_token_id"] = StrCat(eos_token_id());
  for (const RealField& f : kRealFields) m[f.name] = StrCat(this->*f.field);
  return m;
}

absl::StatusOr<ModelConfig> ModelConfig::FromMetadata(
    const std::map<std::string, std::string, std::less<>>& metadata) {
  ModelConfig c;
  auto integer = [&](const char* name, int64_t& out) -> absl::Status {
    auto it = metadata.find(name);
    if (it == metadata.end()) return ConfigError(StrCat("field '", name, "' is missing"));
    if (!absl::SimpleAtoi(it->second, &out)) {
      return ConfigError(StrCat("field '", name, "' = '", it->second, "' is not an integer"));
    }
    return absl::OkStatus();
  };
  for (const char* name : kMetadataInts) {
    CONNEX_RETURN_IF_ERROR(integer(name, c.*IntFieldNamed(name).field));
  }
  int64_t eos = 0;
  CONNEX_RETURN_IF_ERROR(integer("eos_token_id", eos));
  c.eos_token_ids = {eos};
  for (const RealField& f : kRealFields) {
    auto it = metadata.find(f.name);
    if (it == metadata.end()) continue;  // optional: Llama defaults
    if (!absl::SimpleAtod(it->second, &(c.*f.field))) {
      return ConfigError(StrCat("field '", f.name, "' = '", it->second, "' is not a number"));
    }
  }
  CONNEX_RETURN_IF_ERROR(c.Validate());
  return c;
}

LayerRange StageLayers(int64_t num_layers, int stage, int stages) {
  return {num_layers * stage / stages, num_layers * (stage + 1) / stages};
}

}  // namespace connex::engine
