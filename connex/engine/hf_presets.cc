#include "connex/engine/hf_presets.h"

#include "connex/base/strings.h"

namespace connex::engine {
namespace {

struct Shape {
  int64_t vocab, hidden, layers, heads, kv_heads, ffn, max_positions;
};

ModelConfig Config(const char* model_type, Shape s, double rope_theta, double rms_norm_eps,
                   int64_t bos, std::vector<int64_t> eos, bool tied) {
  ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.intermediate_size = s.ffn;
  c.max_position_embeddings = s.max_positions;
  c.rope_theta = rope_theta;
  c.rms_norm_eps = rms_norm_eps;
  c.bos_token_id = bos;
  c.eos_token_ids = std::move(eos);
  c.tie_word_embeddings = tied;
  c.qkv_bias = std::string_view(model_type) == "qwen2";
  c.torch_dtype = "bfloat16";
  return c;
}

RopeScaling Llama3(double factor) {
  return {.type = RopeScaling::Type::kLlama3,
          .factor = factor,
          .low_freq_factor = 1.0,
          .high_freq_factor = 4.0,
          .original_max_position_embeddings = 8192};
}

}  // namespace

std::vector<HfPreset> HfPresets() {
  std::vector<HfPreset> out;
  // Llama 3.x Instruct: three end tokens (<|end_of_text|>, <|eom_id|>, <|eot_id|>).
  const std::vector<int64_t> llama3_eos = {128001, 128008, 128009};
  GenerationDefaults llama3_sampling{.do_sample = true,
                                     .temperature = 0.6,
                                     .top_p = 0.9,
                                     .top_k = std::nullopt,
                                     .min_p = std::nullopt,
                                     .repetition_penalty = std::nullopt};
  {
    ModelConfig c = Config("llama", {128256, 2048, 16, 32, 8, 8192, 131072}, 500000.0, 1e-5, 128000,
                           llama3_eos, /*tied=*/true);
    c.explicit_head_dim = 64;
    c.rope_scaling = Llama3(32.0);
    c.generation = llama3_sampling;
    out.push_back({"llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", c, "llama3_2"});
  }
  {
    ModelConfig c = Config("llama", {128256, 4096, 32, 32, 8, 14336, 131072}, 500000.0, 1e-5,
                           128000, llama3_eos, /*tied=*/false);
    c.rope_scaling = Llama3(8.0);
    c.generation = llama3_sampling;
    out.push_back({"llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", c, "llama3_1"});
  }
  {
    ModelConfig c = Config("qwen2", {151936, 896, 24, 14, 2, 4864, 32768}, 1000000.0, 1e-6, 151643,
                           {151645, 151643}, /*tied=*/true);
    c.generation = {.do_sample = true,
                    .temperature = 0.7,
                    .top_p = 0.8,
                    .top_k = 20,
                    .min_p = std::nullopt,
                    .repetition_penalty = 1.1};
    out.push_back({"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", c, "qwen2_5"});
  }
  {
    ModelConfig c = Config("llama", {32000, 2048, 22, 32, 4, 5632, 2048}, 10000.0, 1e-5, 1, {2},
                           /*tied=*/false);
    // Llama 2's tokenizer: TinyLlama was trained with it (same 32,000 pieces).
    out.push_back({"tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", c, "llama2"});
  }
  {
    ModelConfig c = Config("llama", {49152, 576, 30, 9, 3, 1536, 2048}, 10000.0, 1e-5, 0, {0},
                           /*tied=*/true);
    // SmolLM's own BPE vocabulary ships in no @lenml package.
    out.push_back({"smollm-135m", "HuggingFaceTB/SmolLM-135M", c, ""});
  }
  {
    ModelConfig c = Config("mistral", {32000, 4096, 32, 32, 8, 14336, 32768}, 10000.0, 1e-5, 1, {2},
                           /*tied=*/false);
    c.sliding_window = 4096;
    // Llama 2's tokenizer: the same SentencePiece kind and size, not Mistral's own pieces.
    out.push_back({"mistral-7b", "mistralai/Mistral-7B-v0.1", c, "llama2"});
  }
  return out;
}

absl::StatusOr<HfPreset> FindHfPreset(std::string_view name) {
  std::string names;
  for (HfPreset& p : HfPresets()) {
    if (p.name == name) return std::move(p);
    names += StrCat(names.empty() ? "" : ", ", p.name);
  }
  return absl::InvalidArgumentError(StrCat("--config \"", name, "\" is no preset (", names, ")"));
}

}  // namespace connex::engine
