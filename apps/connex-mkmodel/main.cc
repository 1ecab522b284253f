// connex-mkmodel: writes a Llama-architecture checkpoint (safetensors, config in __metadata__)
// with seeded random weights. The defaults make a decode step cost a few milliseconds on one core
// while the file stays small enough for CI (~72 MB in F32).
#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "connex/engine/random_model.h"
#include "connex/engine/tensor_dict.h"

int main(int argc, char** argv) {
  using connex::engine::DType;
  connex::engine::ModelConfig config;
  std::string out;
  uint64_t seed = 1;
  std::string dtype_name = "f32";
  CLI::App app{"Writes a Llama checkpoint with seeded random weights"};
  app.add_option("--out", out, "output .safetensors path")->required();
  app.add_option("--layers", config.num_hidden_layers, "transformer layers")->capture_default_str();
  app.add_option("--dim", config.hidden_size, "model (hidden) dimension")->capture_default_str();
  app.add_option("--heads", config.num_attention_heads, "attention heads")->capture_default_str();
  app.add_option("--kv-heads", config.num_key_value_heads, "key/value heads (grouped-query)")
      ->capture_default_str();
  app.add_option("--ffn", config.intermediate_size, "SwiGLU width")->capture_default_str();
  app.add_option("--vocab", config.vocab_size, "vocabulary (>= 258: bytes, BOS, EOS)")
      ->capture_default_str();
  app.add_option("--max-positions", config.max_position_embeddings, "longest sequence")
      ->capture_default_str();
  app.add_option("--rope-theta", config.rope_theta, "RoPE base")->capture_default_str();
  app.add_option("--seed", seed, "weights are a function of the seed")->capture_default_str();
  app.add_option("--dtype", dtype_name, "weights dtype: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}, CLI::ignore_case))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  DType dtype = dtype_name == "f16"    ? DType::kF16
                : dtype_name == "bf16" ? DType::kBF16
                                       : DType::kF32;
  if (absl::Status valid = config.Validate(); !valid.ok()) {
    std::cerr << "connex-mkmodel: " << valid.message() << "\n";
    return 2;
  }
  if (absl::Status s = connex::engine::WriteRandomModel(out, config, seed, dtype); !s.ok()) {
    std::cerr << "connex-mkmodel: " << s.message() << "\n";
    return 1;
  }
  const int64_t d = config.hidden_size;
  const int64_t per_layer = 2 * d + 2 * d * config.head_dim() * config.num_attention_heads +
                            2 * d * config.kv_dim() + 3 * d * config.intermediate_size;
  const int64_t params = per_layer * config.num_hidden_layers + 2 * config.vocab_size * d + d;
  std::printf("wrote %s: %lld layers, dim %lld, %lld parameters (%.1f MB %s)\n", out.c_str(),
              static_cast<long long>(config.num_hidden_layers), static_cast<long long>(d),
              static_cast<long long>(params),
              static_cast<double>(params * connex::engine::DTypeSize(dtype)) / 1e6,
              std::string(connex::engine::DTypeName(dtype)).c_str());
  return 0;
}
