#include "connex/engine/hf_model_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/engine/checkpoint.h"
#include "connex/engine/random_model.h"
#include "connex/engine/safetensors.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using Json = nlohmann::json;

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

uint64_t Bytes(const TensorSpec& spec, DType dtype) {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
  return n;
}

absl::Status Errno(const std::string& path, std::string_view what) {
  int err = errno;
  return absl::Status(absl::ErrnoToStatusCode(err),
                      StrCat(path, ": ", what, ": ", std::strerror(err)));
}

// Writes `text` to `path` through a temporary file and a rename.
absl::Status WriteFile(const std::string& path, std::string_view text) {
  const std::string tmp = StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Errno(tmp, "cannot create");
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) {
      ::unlink(tmp.c_str());
      return absl::ResourceExhaustedError(StrCat(path, ": writing ", text.size(), " bytes failed"));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = Errno(path, "rename failed");
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

// One safetensors file of `specs`, each tensor generated and written in turn.
absl::Status WriteShard(const std::string& path, const std::vector<const TensorSpec*>& specs,
                        const HfModelOptions& options) {
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorSpec* spec : specs) {
    const uint64_t n = Bytes(*spec, options.dtype);
    header[spec->name] = {{"dtype", std::string(DTypeName(options.dtype))},
                          {"shape", spec->shape},
                          {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = DumpJson(header);
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  const std::string tmp = StrCat(path, ".tmp.", ::getpid());
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return Errno(tmp, "cannot create");
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>(text.size() >> (8 * i));
  out.write(length, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorSpec* spec : specs) {
    Tensor t = ConvertF32(RandomHfTensor(*spec, options.seed), options.dtype);
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size()));
  }
  out.close();
  if (!out) {
    ::unlink(tmp.c_str());
    return absl::ResourceExhaustedError(StrCat(path, ": writing ", offset, " bytes failed"));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = Errno(path, "rename failed");
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

absl::Status CopyTokenizer(const std::string& from, const std::string& dir) {
  bool any = false;
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}) {
    const std::string src = StrCat(from, "/", name);
    std::ifstream in(src, std::ios::binary);
    if (!in) {
      if (std::string_view(name) == "tokenizer.json") {
        return absl::InvalidArgumentError(StrCat("--tokenizer-from ", from, ": no ", name));
      }
      continue;
    }
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CONNEX_RETURN_IF_ERROR(WriteFile(StrCat(dir, "/", name), text));
    any = true;
  }
  return any ? absl::OkStatus() : absl::InvalidArgumentError(StrCat(from, ": no tokenizer"));
}

}  // namespace

std::vector<TensorSpec> HfTensorSpecs(const ModelConfig& c) {
  const int64_t d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size,
                v = c.vocab_size;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {v, d}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = StrCat("model.layers.", i, ".");
    specs.push_back({p + "input_layernorm.weight", {d}});
    specs.push_back({p + "self_attn.q_proj.weight", {q, d}});
    if (c.qkv_bias) specs.push_back({p + "self_attn.q_proj.bias", {q}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, d}});
    if (c.qkv_bias) specs.push_back({p + "self_attn.k_proj.bias", {kv}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    if (c.qkv_bias) specs.push_back({p + "self_attn.v_proj.bias", {kv}});
    specs.push_back({p + "self_attn.o_proj.weight", {d, q}});
    if (c.o_bias) specs.push_back({p + "self_attn.o_proj.bias", {d}});
    specs.push_back({p + "post_attention_layernorm.weight", {d}});
    specs.push_back({p + "mlp.gate_proj.weight", {f, d}});
    specs.push_back({p + "mlp.up_proj.weight", {f, d}});
    specs.push_back({p + "mlp.down_proj.weight", {d, f}});
  }
  specs.push_back({"model.norm.weight", {d}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {v, d}});
  return specs;
}

Tensor RandomHfTensor(const TensorSpec& spec, uint64_t seed) {
  if (EndsWith(spec.name, "norm.weight")) {
    return RandomUniformTensor(spec.name, spec.shape, 0.1, seed, /*mean=*/1.0);
  }
  if (EndsWith(spec.name, ".bias")) return RandomUniformTensor(spec.name, spec.shape, 0.2, seed);
  // Weights [rows, fan-in]; the embedding [vocab, hidden] too. Queries and keys three times
  // that: attention scores of standard deviation ~9 rather than ~1 keep attention sharp, where a
  // deep stack of flat random attention averages every position into one state and greedy
  // decoding loops on a token or two (measured, 32 tokens: 4-13 distinct at 1×, 23-32 at 3×
  // on small shapes; the full Llama-3.2-1B shape repeated one token 16 times at 2×, none at 3×).
  const double fan_in = static_cast<double>(spec.shape.back());
  const bool qk = EndsWith(spec.name, "q_proj.weight") || EndsWith(spec.name, "k_proj.weight");
  return RandomUniformTensor(spec.name, spec.shape, (qk ? 3.0 : 1.0) / std::sqrt(fan_in), seed);
}

absl::StatusOr<std::string> FindTokenizerDir(const std::string& from, const std::string& family) {
  struct stat st;
  if (::stat(StrCat(from, "/tokenizer.json").c_str(), &st) == 0) return from;
  const std::string package = StrCat(from, "/tokenizer-", family, "/models");
  if (!family.empty() && ::stat(StrCat(package, "/tokenizer.json").c_str(), &st) == 0) {
    return package;
  }
  return absl::NotFoundError(
      StrCat("no tokenizer.json in ", from, family.empty() ? "" : StrCat(" nor in ", package)));
}

absl::StatusOr<HfModelSummary> WriteRandomHfModel(const std::string& dir, const ModelConfig& config,
                                                  const HfModelOptions& options) {
  CONNEX_RETURN_IF_ERROR(config.Validate());
  if (options.dtype != DType::kF32 && options.dtype != DType::kF16 &&
      options.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        StrCat("weights dtype ", DTypeName(options.dtype), " is not F32, F16 or BF16"));
  }
  if (options.shard_size == 0) return absl::InvalidArgumentError("shard size 0");
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return Errno(dir, "cannot create");

  const std::vector<TensorSpec> specs = HfTensorSpecs(config);
  HfModelSummary summary;
  std::vector<std::vector<const TensorSpec*>> shards(1);
  uint64_t in_shard = 0;
  for (const TensorSpec& spec : specs) {
    const uint64_t n = Bytes(spec, options.dtype);
    if (!shards.back().empty() && in_shard + n > options.shard_size) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&spec);
    in_shard += n;
    summary.bytes += n;
    summary.parameters += static_cast<int64_t>(n / DTypeSize(options.dtype));
  }
  Json weight_map = Json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file = shards.size() == 1 ? kSingleFile : name;
    CONNEX_RETURN_IF_ERROR(WriteShard(StrCat(dir, "/", file), shards[s], options));
    for (const TensorSpec* spec : shards[s]) weight_map[spec->name] = file;
    summary.files.push_back(file);
  }
  const std::string index = StrCat(dir, "/", kIndexFile);
  if (shards.size() > 1) {
    Json j = {{"metadata", {{"total_size", summary.bytes}}}, {"weight_map", weight_map}};
    CONNEX_RETURN_IF_ERROR(WriteFile(index, DumpJson(j, 2) + "\n"));
  } else {
    ::unlink(index.c_str());  // a stale index would win over model.safetensors
  }
  ModelConfig c = config;
  c.torch_dtype = options.dtype == DType::kF32   ? "float32"
                  : options.dtype == DType::kF16 ? "float16"
                                                 : "bfloat16";
  CONNEX_RETURN_IF_ERROR(WriteFile(StrCat(dir, "/config.json"), c.ToJson()));
  CONNEX_RETURN_IF_ERROR(
      WriteFile(StrCat(dir, "/generation_config.json"), c.GenerationConfigJson()));
  if (!options.tokenizer_dir.empty())
    CONNEX_RETURN_IF_ERROR(CopyTokenizer(options.tokenizer_dir, dir));
  return summary;
}

}  // namespace connex::engine
