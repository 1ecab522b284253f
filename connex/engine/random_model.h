// Checkpoints with seeded random weights (connex-mkmodel, tests, benchmarks). The weights are a
// pure function of (config, seed): each tensor has its own generator seeded from the seed and its
// name. Thread-safe (pure functions).
#ifndef CONNEX_ENGINE_RANDOM_MODEL_H_
#define CONNEX_ENGINE_RANDOM_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "connex/engine/model_config.h"
#include "connex/engine/tensor_dict.h"

namespace connex::engine {

// An F32 tensor uniform around `mean` with standard deviation `stddev`, drawn from a splitmix64
// stream seeded by (seed, name): the same bits on every platform.
Tensor RandomUniformTensor(const std::string& name, std::vector<int64_t> shape, double stddev,
                           uint64_t seed, double mean = 0.0);

// Every tensor of `config` (Hugging Face Llama names), in `dtype` (F32, F16 or BF16).
// Linear layers are uniform with standard deviation 1/sqrt(fan-in), the embedding has standard
// deviation 1, norm weights are 1.
TensorDict RandomModelTensors(const ModelConfig& config, uint64_t seed, DType dtype);

// The number of weights of `config` (every tensor of RandomModelTensors). `config` must be valid.
int64_t ParameterCount(const ModelConfig& config);

// WriteRandomModel refuses a checkpoint whose weights are larger than this: it builds the model
// in memory and serialises it, so it needs about twice the file size.
inline constexpr uint64_t kMaxRandomModelBytes = uint64_t{16} << 30;

// Writes RandomModelTensors(...) to `path` as safetensors with the config in __metadata__.
// InvalidArgument when the config is invalid, has no __metadata__ form (HasMetadataForm) or its
// weights exceed kMaxRandomModelBytes;
// ResourceExhausted when the memory to build it cannot be allocated; the write's error otherwise.
absl::Status WriteRandomModel(const std::string& path, const ModelConfig& config, uint64_t seed,
                              DType dtype);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_RANDOM_MODEL_H_
