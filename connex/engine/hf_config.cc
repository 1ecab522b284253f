// ModelConfig's Hugging Face forms: config.json and generation_config.json. Every key the engine
// would otherwise get wrong silently — another architecture, activation, rope type, a bias of the
// MLP, Qwen2's sliding window, a quantized checkpoint — is refused naming the key and its value.
#include <cmath>
#include <utility>

#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/internal/errors.h"
#include "connex/engine/model_config.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using Json = nlohmann::json;

struct Architecture {
  const char* model_type;
  const char* architecture;
};

constexpr Architecture kArchitectures[] = {
    {"llama", "LlamaForCausalLM"},
    {"mistral", "MistralForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
};

constexpr std::pair<const char*, int64_t ModelConfig::*> kRequiredInts[] = {
    {"vocab_size", &ModelConfig::vocab_size},
    {"hidden_size", &ModelConfig::hidden_size},
    {"num_hidden_layers", &ModelConfig::num_hidden_layers},
    {"num_attention_heads", &ModelConfig::num_attention_heads},
    {"intermediate_size", &ModelConfig::intermediate_size},
};

using internal::Bad;

std::string Show(const Json& j) {
  std::string s = DumpJson(j);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

const Architecture* FindArchitecture(std::string_view model_type, std::string_view architecture) {
  for (const Architecture& a : kArchitectures) {
    if (model_type == a.model_type || architecture == a.architecture) return &a;
  }
  return nullptr;
}

// Reads integer `key` into `out` when present and not null. `required`: absence is an error.
absl::Status Integer(const Json& j, const char* key, int64_t& out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return required ? Bad(StrCat("'", key, "' is missing")) : absl::OkStatus();
  }
  if (!it->is_number_integer()) return Bad(StrCat("'", key, "' ", Show(*it), " is not an integer"));
  out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status Real(const Json& j, const char* key, double& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return Bad(StrCat("'", key, "' ", Show(*it), " is not a number"));
  out = it->get<double>();
  return absl::OkStatus();
}

absl::Status Boolean(const Json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return Bad(StrCat("'", key, "' ", Show(*it), " is not true or false"));
  out = it->get<bool>();
  return absl::OkStatus();
}

// `eos_token_id`: an int, a list of ints, or null (no end token).
absl::Status TokenList(const Json& j, const char* key, std::vector<int64_t>& out) {
  auto it = j.find(key);
  if (it == j.end()) return absl::OkStatus();
  std::vector<int64_t> ids;
  if (it->is_number_integer()) {
    ids.push_back(it->get<int64_t>());
  } else if (it->is_array()) {
    for (const Json& e : *it) {
      if (!e.is_number_integer()) {
        return Bad(StrCat("'", key, "' ", Show(*it), " is not an integer or a list of integers"));
      }
      ids.push_back(e.get<int64_t>());
    }
  } else if (!it->is_null()) {
    return Bad(StrCat("'", key, "' ", Show(*it), " is not an integer or a list of integers"));
  }
  out = std::move(ids);
  return absl::OkStatus();
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& j) {
  RopeScaling r;
  if (j.is_null()) return r;
  if (!j.is_object()) return Bad(StrCat("'rope_scaling' ", Show(j), " is not an object or null"));
  // Newer configs say `rope_type`, older ones `type`; when both are there `rope_type` is read.
  auto it = j.find("rope_type");
  const char* key = "rope_type";
  if (it == j.end()) {
    it = j.find("type");
    key = "type";
  }
  if (it == j.end() || !it->is_string()) {
    return Bad(StrCat("'rope_scaling' ", Show(j), " has no 'rope_type' (or 'type') string"));
  }
  const std::string type = it->get<std::string>();
  if (type == "default") return r;
  if (type == "linear") {
    r.type = RopeScaling::Type::kLinear;
  } else if (type == "dynamic") {
    r.type = RopeScaling::Type::kDynamic;
  } else if (type == "llama3") {
    r.type = RopeScaling::Type::kLlama3;
  } else {
    return Bad(
        StrCat("rope_scaling.", key, " \"", type, "\" is not supported (llama3, linear, dynamic)"));
  }
  auto number = [&](const char* name, double& out) -> absl::Status {
    auto f = j.find(name);
    if (f == j.end()) {
      return Bad(StrCat("rope_scaling.", name, " of rope type \"", type, "\" is missing"));
    }
    if (!f->is_number())
      return Bad(StrCat("rope_scaling.", name, " ", Show(*f), " is not a number"));
    out = f->get<double>();
    return absl::OkStatus();
  };
  CONNEX_RETURN_IF_ERROR(number("factor", r.factor));
  if (r.type == RopeScaling::Type::kLlama3) {
    CONNEX_RETURN_IF_ERROR(number("low_freq_factor", r.low_freq_factor));
    CONNEX_RETURN_IF_ERROR(number("high_freq_factor", r.high_freq_factor));
    double original = 0;
    CONNEX_RETURN_IF_ERROR(number("original_max_position_embeddings", original));
    if (original != std::floor(original) || !(original >= 1) || original > (1 << 24)) {
      return Bad(StrCat("rope_scaling.original_max_position_embeddings ", original,
                        " is not a positive integer"));
    }
    r.original_max_position_embeddings = static_cast<int64_t>(original);
  }
  return r;
}

absl::StatusOr<ModelConfig> ParseConfig(const Json& j) {
  if (!j.is_object()) return Bad("config.json is not a JSON object");
  ModelConfig c;
  // The architecture: `model_type` and `architectures[0]` must name the same supported one.
  std::string model_type, architecture;
  if (auto it = j.find("model_type"); it != j.end()) {
    if (!it->is_string()) return Bad(StrCat("'model_type' ", Show(*it), " is not a string"));
    model_type = it->get<std::string>();
  }
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 1 || !(*it)[0].is_string()) {
      return Bad(StrCat("'architectures' ", Show(*it), " is not a list of one name"));
    }
    architecture = (*it)[0].get<std::string>();
  }
  if (model_type.empty() && architecture.empty()) {
    return Bad("neither 'model_type' nor 'architectures' is given");
  }
  const Architecture* arch = FindArchitecture(model_type, architecture);
  if (arch == nullptr || (!model_type.empty() && model_type != arch->model_type) ||
      (!architecture.empty() && architecture != arch->architecture)) {
    const bool by_type = !model_type.empty() && (arch == nullptr || model_type != arch->model_type);
    return Bad(StrCat(by_type ? "model_type \"" : "architectures[0] \"",
                      by_type ? model_type : architecture,
                      "\" is not supported (LlamaForCausalLM/llama, MistralForCausalLM/mistral, "
                      "Qwen2ForCausalLM/qwen2)"));
  }
  c.model_type = arch->model_type;

  for (const auto& [key, field] : kRequiredInts) {
    CONNEX_RETURN_IF_ERROR(Integer(j, key, c.*field, /*required=*/true));
  }
  c.num_key_value_heads = c.num_attention_heads;  // HF's default: no grouping
  CONNEX_RETURN_IF_ERROR(Integer(j, "num_key_value_heads", c.num_key_value_heads, false));
  CONNEX_RETURN_IF_ERROR(Integer(j, "max_position_embeddings", c.max_position_embeddings, false));
  CONNEX_RETURN_IF_ERROR(Integer(j, "head_dim", c.explicit_head_dim, false));
  c.bos_token_id = -1;
  CONNEX_RETURN_IF_ERROR(Integer(j, "bos_token_id", c.bos_token_id, false));
  c.eos_token_ids.clear();
  CONNEX_RETURN_IF_ERROR(TokenList(j, "eos_token_id", c.eos_token_ids));
  CONNEX_RETURN_IF_ERROR(Real(j, "rope_theta", c.rope_theta));
  CONNEX_RETURN_IF_ERROR(Real(j, "rms_norm_eps", c.rms_norm_eps));
  CONNEX_RETURN_IF_ERROR(Boolean(j, "tie_word_embeddings", c.tie_word_embeddings));
  if (auto it = j.find("rope_scaling"); it != j.end()) {
    CONNEX_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*it));
  }
  if (auto it = j.find("hidden_act"); it != j.end() && *it != "silu") {
    return Bad(StrCat("hidden_act ", Show(*it), " is not supported (silu)"));
  }
  if (auto it = j.find("quantization_config"); it != j.end() && !it->is_null()) {
    return Bad(StrCat("quantization_config ", Show(*it),
                      " is not supported (F32, F16 or BF16 weights only)"));
  }
  bool mlp_bias = false;
  CONNEX_RETURN_IF_ERROR(Boolean(j, "mlp_bias", mlp_bias));
  if (mlp_bias) return Bad("mlp_bias true is not supported (Llama's MLP has no bias)");
  if (auto it = j.find("partial_rotary_factor"); it != j.end() && *it != 1 && *it != 1.0) {
    return Bad(StrCat("partial_rotary_factor ", Show(*it), " is not supported (1)"));
  }
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) {
    c.torch_dtype = it->get<std::string>();
  }

  if (c.model_type == "llama") {
    bool attention_bias = false;
    CONNEX_RETURN_IF_ERROR(Boolean(j, "attention_bias", attention_bias));
    c.qkv_bias = c.o_bias = attention_bias;
  } else if (c.model_type == "qwen2") {
    c.qkv_bias = true;  // Qwen2's q/k/v projections always have biases, o_proj none
    bool use_sliding_window = false;
    CONNEX_RETURN_IF_ERROR(Boolean(j, "use_sliding_window", use_sliding_window));
    if (use_sliding_window) {
      return Bad("use_sliding_window true is not supported for qwen2 (its per-layer windows)");
    }
  } else {  // mistral: the window is honoured; null means none
    CONNEX_RETURN_IF_ERROR(Integer(j, "sliding_window", c.sliding_window, false));
    // A window as long as the context changes nothing.
    if (c.sliding_window >= c.max_positions()) c.sliding_window = 0;
  }
  CONNEX_RETURN_IF_ERROR(c.Validate());
  return c;
}

Json TokenListJson(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view json) {
  Json j = ParseJson(json);
  if (j.is_discarded()) return Bad("config.json is not valid JSON");
  try {
    return ParseConfig(j);
  } catch (const std::exception& e) {  // defensive: every access above is type-checked
    return Bad(StrCat("config.json: ", e.what()));
  }
}

std::string ModelConfig::ToJson() const {
  const Architecture* arch = FindArchitecture(model_type, "");
  Json j = Json::object();
  j["architectures"] = {arch != nullptr ? arch->architecture : "LlamaForCausalLM"};
  j["model_type"] = model_type;
  j["hidden_act"] = "silu";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = max_position_embeddings;
  if (explicit_head_dim > 0) j["head_dim"] = explicit_head_dim;
  j["bos_token_id"] = bos_token_id >= 0 ? Json(bos_token_id) : Json(nullptr);
  j["eos_token_id"] = TokenListJson(eos_token_ids);
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
    case RopeScaling::Type::kDynamic:
      j["rope_scaling"] = {
          {"rope_type", rope_scaling.type == RopeScaling::Type::kLinear ? "linear" : "dynamic"},
          {"factor", rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", rope_scaling.factor},
          {"low_freq_factor", rope_scaling.low_freq_factor},
          {"high_freq_factor", rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
  }
  if (model_type == "llama") {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = false;
  } else if (model_type == "qwen2") {
    j["use_sliding_window"] = false;
  } else {
    j["sliding_window"] = sliding_window > 0 ? Json(sliding_window) : Json(nullptr);
  }
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  return DumpJson(j, 2) + "\n";
}

std::string ModelConfig::GenerationConfigJson() const {
  Json j = Json::object();
  j["bos_token_id"] = bos_token_id >= 0 ? Json(bos_token_id) : Json(nullptr);
  j["eos_token_id"] = TokenListJson(eos_token_ids);
  if (generation.do_sample) j["do_sample"] = *generation.do_sample;
  if (generation.temperature) j["temperature"] = *generation.temperature;
  if (generation.top_p) j["top_p"] = *generation.top_p;
  if (generation.top_k) j["top_k"] = *generation.top_k;
  if (generation.min_p) j["min_p"] = *generation.min_p;
  if (generation.repetition_penalty) j["repetition_penalty"] = *generation.repetition_penalty;
  return DumpJson(j, 2) + "\n";
}

absl::Status ModelConfig::ApplyGenerationConfig(std::string_view json) {
  Json j = ParseJson(json);
  if (j.is_discarded() || !j.is_object()) {
    return Bad("generation_config.json is not a JSON object");
  }
  ModelConfig c = *this;
  CONNEX_RETURN_IF_ERROR(Integer(j, "bos_token_id", c.bos_token_id, false));
  CONNEX_RETURN_IF_ERROR(TokenList(j, "eos_token_id", c.eos_token_ids));
  bool do_sample = false;
  if (j.contains("do_sample")) {
    CONNEX_RETURN_IF_ERROR(Boolean(j, "do_sample", do_sample));
    c.generation.do_sample = do_sample;
  }
  for (auto [key, field] :
       {std::pair{"temperature", &GenerationDefaults::temperature},
        std::pair{"top_p", &GenerationDefaults::top_p},
        std::pair{"min_p", &GenerationDefaults::min_p},
        std::pair{"repetition_penalty", &GenerationDefaults::repetition_penalty}}) {
    double v = 0;
    if (!j.contains(key) || j[key].is_null()) continue;
    CONNEX_RETURN_IF_ERROR(Real(j, key, v));
    c.generation.*field = v;
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    int64_t k = 0;
    CONNEX_RETURN_IF_ERROR(Integer(j, "top_k", k, false));
    c.generation.top_k = k;
  }
  CONNEX_RETURN_IF_ERROR(c.Validate());
  *this = std::move(c);
  return absl::OkStatus();
}

}  // namespace connex::engine
