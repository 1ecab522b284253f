#include "connex/engine/model_config.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "connex/base/check.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using Json = nlohmann::json;

struct IntField {
  const char* name;
  int64_t ModelConfig::*field;
  int64_t min;
  int64_t max;
};

constexpr IntField kIntFields[] = {
    {"vocab_size", &ModelConfig::vocab_size, 258, 1 << 20},
    {"hidden_size", &ModelConfig::hidden_size, 2, 1 << 16},
    {"num_hidden_layers", &ModelConfig::num_hidden_layers, 1, 1024},
    {"num_attention_heads", &ModelConfig::num_attention_heads, 1, 1024},
    {"num_key_value_heads", &ModelConfig::num_key_value_heads, 1, 1024},
    {"intermediate_size", &ModelConfig::intermediate_size, 1, 1 << 18},
    {"max_position_embeddings", &ModelConfig::max_position_embeddings, 1, 1 << 20},
    {"bos_token_id", &ModelConfig::bos_token_id, 0, (1 << 20) - 1},
    {"eos_token_id", &ModelConfig::eos_token_id, 0, (1 << 20) - 1},
};

struct RealField {
  const char* name;
  double ModelConfig::*field;
};

constexpr RealField kRealFields[] = {
    {"rope_theta", &ModelConfig::rope_theta},
    {"rms_norm_eps", &ModelConfig::rms_norm_eps},
};

absl::Status Bad(std::string_view what) {
  return absl::InvalidArgumentError(StrCat("model config: ", what));
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  for (const IntField& f : kIntFields) {
    int64_t v = this->*f.field;
    if (v < f.min || v > f.max) {
      return Bad(StrCat("'", f.name, "' = ", v, " is out of range [", f.min, ", ", f.max, "]"));
    }
  }
  if (hidden_size % num_attention_heads != 0) {
    return Bad(StrCat("'hidden_size' ", hidden_size, " is not a multiple of 'num_attention_heads' ",
                      num_attention_heads));
  }
  if (head_dim() % 2 != 0) return Bad(StrCat("head dimension ", head_dim(), " is odd (RoPE)"));
  if (num_attention_heads % num_key_value_heads != 0) {
    return Bad(StrCat("'num_attention_heads' ", num_attention_heads,
                      " is not a multiple of 'num_key_value_heads' ", num_key_value_heads));
  }
  if (bos_token_id >= vocab_size || eos_token_id >= vocab_size) {
    return Bad(StrCat("'bos_token_id'/'eos_token_id' must be < 'vocab_size' ", vocab_size));
  }
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta)) {
    return Bad(StrCat("'rope_theta' = ", rope_theta, " must be a finite number > 1"));
  }
  if (!(rms_norm_eps > 0.0) || !(rms_norm_eps < 1.0)) {
    return Bad(StrCat("'rms_norm_eps' = ", rms_norm_eps, " must be in (0, 1)"));
  }
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> ModelConfig::FieldRange(std::string_view name) {
  for (const IntField& f : kIntFields) {
    if (name == f.name) return {f.min, f.max};
  }
  CONNEX_CHECK(false && "FieldRange of a name that is no integer field of ModelConfig");
  return {0, 0};
}

std::map<std::string, std::string, std::less<>> ModelConfig::ToMetadata() const {
  std::map<std::string, std::string, std::less<>> m;
  m["format"] = "pt";  // what Hugging Face's loaders expect
  m["architecture"] = "LlamaForCausalLM";
  for (const IntField& f : kIntFields) m[f.name] = StrCat(this->*f.field);
  for (const RealField& f : kRealFields) m[f.name] = StrCat(this->*f.field);
  return m;
}

absl::StatusOr<ModelConfig> ModelConfig::FromMetadata(
    const std::map<std::string, std::string, std::less<>>& metadata) {
  ModelConfig c;
  for (const IntField& f : kIntFields) {
    auto it = metadata.find(f.name);
    if (it == metadata.end()) return Bad(StrCat("field '", f.name, "' is missing"));
    if (!absl::SimpleAtoi(it->second, &(c.*f.field))) {
      return Bad(StrCat("field '", f.name, "' = '", it->second, "' is not an integer"));
    }
  }
  for (const RealField& f : kRealFields) {
    auto it = metadata.find(f.name);
    if (it == metadata.end()) continue;  // optional: Llama defaults
    if (!absl::SimpleAtod(it->second, &(c.*f.field))) {
      return Bad(StrCat("field '", f.name, "' = '", it->second, "' is not a number"));
    }
  }
  CONNEX_RETURN_IF_ERROR(c.Validate());
  return c;
}

std::string ModelConfig::ToJson() const {
  Json j = Json::object();
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = false;
  for (const IntField& f : kIntFields) j[f.name] = this->*f.field;
  for (const RealField& f : kRealFields) j[f.name] = this->*f.field;
  return j.dump(2) + "\n";
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view json) {
  Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad("config.json is not a JSON object");
  ModelConfig c;
  for (const IntField& f : kIntFields) {
    auto it = j.find(f.name);
    if (it == j.end()) {
      if (std::string_view(f.name) == "max_position_embeddings") continue;
      return Bad(StrCat("field '", f.name, "' is missing"));
    }
    if (!it->is_number_integer()) return Bad(StrCat("field '", f.name, "' is not an integer"));
    c.*f.field = it->get<int64_t>();
  }
  for (const RealField& f : kRealFields) {
    auto it = j.find(f.name);
    if (it == j.end()) continue;
    if (!it->is_number()) return Bad(StrCat("field '", f.name, "' is not a number"));
    c.*f.field = it->get<double>();
  }
  if (auto it = j.find("tie_word_embeddings");
      it != j.end() && it->is_boolean() && it->get<bool>()) {
    return Bad(
        "'tie_word_embeddings' = true is not supported (the checkpoint needs lm_head.weight)");
  }
  CONNEX_RETURN_IF_ERROR(c.Validate());
  return c;
}

LayerRange StageLayers(int64_t num_layers, int stage, int stages) {
  return {num_layers * stage / stages, num_layers * (stage + 1) / stages};
}

}  // namespace connex::engine
