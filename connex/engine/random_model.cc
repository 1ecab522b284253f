#include "connex/engine/random_model.h"

#include <cmath>
#include <new>
#include <vector>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/safetensors.h"

namespace connex::engine {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t NameSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

Tensor Uniform(const std::string& name, std::vector<int64_t> shape, double stddev, uint64_t seed) {
  return RandomUniformTensor(name, std::move(shape), stddev, seed);
}

Tensor Ones(int64_t n) {
  Tensor t = Tensor::Zeros<float>({n});
  for (float& x : t.mutable_values<float>()) x = 1.0f;
  return t;
}

}  // namespace

Tensor RandomUniformTensor(const std::string& name, std::vector<int64_t> shape, double stddev,
                           uint64_t seed, double mean) {
  Tensor t = Tensor::Zeros<float>(std::move(shape));
  uint64_t state = NameSeed(seed, name);
  const double half_width = stddev * std::sqrt(3.0);
  for (float& x : t.mutable_values<float>()) {
    double u = static_cast<double>(SplitMix64(state) >> 40) * (1.0 / (1ull << 24));  // [0, 1)
    x = static_cast<float>(mean + (2.0 * u - 1.0) * half_width);
  }
  return t;
}

TensorDict RandomModelTensors(const ModelConfig& c, uint64_t seed, DType dtype) {
  const int64_t d = c.hidden_size, q = c.head_dim() * c.num_attention_heads, kv = c.kv_dim(),
                f = c.intermediate_size, v = c.vocab_size;
  TensorDict out;
  auto add = [&](const std::string& name, Tensor t) { out.Set(name, ConvertF32(t, dtype)); };
  auto linear = [&](const std::string& name, int64_t rows, int64_t cols) {
    add(name, Uniform(name, {rows, cols}, 1.0 / std::sqrt(static_cast<double>(cols)), seed));
  };
  add("model.embed_tokens.weight", Uniform("model.embed_tokens.weight", {v, d}, 1.0, seed));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = StrCat("model.layers.", i, ".");
    add(p + "input_layernorm.weight", Ones(d));
    add(p + "post_attention_layernorm.weight", Ones(d));
    linear(p + "self_attn.q_proj.weight", q, d);
    linear(p + "self_attn.k_proj.weight", kv, d);
    linear(p + "self_attn.v_proj.weight", kv, d);
    linear(p + "self_attn.o_proj.weight", d, q);
    linear(p + "mlp.gate_proj.weight", f, d);
    linear(p + "mlp.up_proj.weight", f, d);
    linear(p + "mlp.down_proj.weight", d, f);
  }
  add("model.norm.weight", Ones(d));
  linear("lm_head.weight", v, d);
  return out;
}

int64_t ParameterCount(const ModelConfig& c) {
  const int64_t d = c.hidden_size;
  const int64_t per_layer = 2 * d + 2 * d * c.head_dim() * c.num_attention_heads +
                            2 * d * c.kv_dim() + 3 * d * c.intermediate_size;
  return per_layer * c.num_hidden_layers + 2 * c.vocab_size * d + d;
}

absl::Status WriteRandomModel(const std::string& path, const ModelConfig& config, uint64_t seed,
                              DType dtype) {
  CONNEX_RETURN_IF_ERROR(config.Validate());
  if (!config.HasMetadataForm()) {
    return absl::InvalidArgumentError(
        "the one-file form (__metadata__) carries a plain Llama only: no head_dim, biases, tied "
        "head, rope scaling, window or several end tokens (write a Hugging Face directory)");
  }
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        StrCat("weights dtype ", DTypeName(dtype), " is not F32, F16 or BF16"));
  }
  const uint64_t bytes = static_cast<uint64_t>(ParameterCount(config)) * DTypeSize(dtype);
  if (bytes > kMaxRandomModelBytes) {
    return absl::InvalidArgumentError(StrCat("the weights would take ", bytes,
                                             " bytes, over the limit of ", kMaxRandomModelBytes,
                                             " bytes: fewer layers or smaller dimensions"));
  }
  try {
    return WriteSafetensors(path, RandomModelTensors(config, seed, dtype), config.ToMetadata());
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        StrCat(path, ": out of memory building a checkpoint of ", bytes, " bytes"));
  }
}

}  // namespace connex::engine
