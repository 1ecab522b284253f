// connex-mkmodel: writes a Llama-architecture checkpoint (safetensors, config in __metadata__)
// with seeded random weights. The defaults make a decode step cost a few milliseconds on one core
// while the file stays small enough for CI (~72 MB in F32).
#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "connex/base/cli.h"
#include "connex/engine/random_model.h"
#include "connex/engine/tensor_dict.h"

int main(int argc, char** argv) {
  using connex::engine::DType;
  using connex::engine::ModelConfig;
  ModelConfig config;
  std::string out;
  uint64_t seed = 1;
  std::string dtype_name = "f32";
  CLI::App app{"Writes a Llama checkpoint with seeded random weights"};
  // Each shape flag is range-checked as ModelConfig::Validate checks the field it sets.
  auto shape = [&](const char* flag, int64_t& field, const char* name, const char* help) {
    auto [min, max] = ModelConfig::FieldRange(name);
    app.add_option(flag, field, help)->check(CLI::Range(min, max))->capture_default_str();
  };
  app.add_option("--out", out, "output .safetensors path")->required();
  shape("--layers", config.num_hidden_layers, "num_hidden_layers", "transformer layers");
  shape("--dim", config.hidden_size, "hidden_size", "model (hidden) dimension");
  shape("--heads", config.num_attention_heads, "num_attention_heads", "attention heads");
  shape("--kv-heads", config.num_key_value_heads, "num_key_value_heads",
        "key/value heads (grouped-query)");
  shape("--ffn", config.intermediate_size, "intermediate_size", "SwiGLU width");
  shape("--vocab", config.vocab_size, "vocab_size", "vocabulary (>= 258: bytes, BOS, EOS)");
  shape("--max-positions", config.max_position_embeddings, "max_position_embeddings",
        "longest sequence");
  app.add_option("--rope-theta", config.rope_theta, "RoPE base (> 1)")
      ->check(CLI::Range(1.0, 1e12))
      ->capture_default_str();
  app.add_option("--seed", seed, "weights are a function of the seed")->capture_default_str();
  app.add_option("--dtype", dtype_name, "weights dtype: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}, CLI::ignore_case))
      ->capture_default_str();
  connex::AddLogLevelFlag(app);
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv)) return *code;
  DType dtype = dtype_name == "f16"    ? DType::kF16
                : dtype_name == "bf16" ? DType::kBF16
                                       : DType::kF32;
  if (absl::Status valid = config.Validate(); !valid.ok()) {
    std::cerr << "connex-mkmodel: " << valid.message() << "\n";
    return connex::kUsageExitCode;
  }
  if (absl::Status s = connex::engine::WriteRandomModel(out, config, seed, dtype); !s.ok()) {
    // Too large for the limit (InvalidArgument) is a bad value; a failed write a runtime failure.
    std::cerr << "connex-mkmodel: " << s.message()
              << (s.code() == absl::StatusCode::kInvalidArgument
                      ? " (--layers, --dim, --ffn, --vocab, --dtype)"
                      : "")
              << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? connex::kUsageExitCode : 1;
  }
  const int64_t params = connex::engine::ParameterCount(config);
  std::printf("wrote %s: %lld layers, dim %lld, %lld parameters (%.1f MB %s)\n", out.c_str(),
              static_cast<long long>(config.num_hidden_layers),
              static_cast<long long>(config.hidden_size), static_cast<long long>(params),
              static_cast<double>(params * connex::engine::DTypeSize(dtype)) / 1e6,
              std::string(connex::engine::DTypeName(dtype)).c_str());
  return 0;
}
