// Where a stage engine keeps the weights it streams: mapped from the checkpoint's files (the
// default), or copied into memory of its own (CONNEX_ENGINE_WEIGHTS=copied). Mapped weights are
// page-cache pages, shared by every process that maps the same file and read in on first use;
// copied ones are read once at load into anonymous memory with transparent huge pages asked for
// (MADV_HUGEPAGE), which decode streams faster on this project's machines: a Llama-3.2-1B-shaped
// BF16 model's step read 39 GB/s of mapped weights and 44-45 of copied ones on two threads, 19-21
// and 22-24 on one (docs/results.md, "Weights copied"). The copy costs the load a read of the
// stage's weights, and their memory is the process's own, not shared. Bits do not depend on it.
#ifndef CONNEX_ENGINE_WEIGHT_MEMORY_H_
#define CONNEX_ENGINE_WEIGHT_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::engine {

enum class WeightMemory { kMapped, kCopied };

std::string_view WeightMemoryName(WeightMemory m);  // "mapped", "copied"
// "mapped" or "copied"; InvalidArgument naming the value otherwise.
absl::StatusOr<WeightMemory> ParseWeightMemory(std::string_view text);
// CONNEX_ENGINE_WEIGHTS, default mapped; InvalidArgument names the variable and its value.
absl::StatusOr<WeightMemory> WeightMemoryFromEnv();

// Anonymous memory for copied weights: chunks of at least `chunk_bytes` (256 MiB) of address
// space, huge pages asked for, handed out 64-byte aligned; a page takes memory once written.
// Thread-compatible.
class WeightArena {
 public:
  explicit WeightArena(size_t chunk_bytes = size_t{256} << 20) : chunk_bytes_(chunk_bytes) {}
  ~WeightArena();
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;

  // A copy of `bytes`, valid as long as the arena. ResourceExhausted when no memory is left.
  absl::StatusOr<std::span<const uint8_t>> Copy(std::span<const uint8_t> bytes);
  // Bytes copied so far.
  int64_t bytes() const { return bytes_; }

 private:
  struct Chunk {
    uint8_t* base = nullptr;
    size_t size = 0;
    size_t used = 0;
  };
  const size_t chunk_bytes_;
  std::vector<Chunk> chunks_;
  int64_t bytes_ = 0;
};

// Gives back this process's mapping of the whole pages within `bytes` (part of a read-only file
// mapping whose contents were copied): the page cache keeps them as the kernel sees fit, and a
// later read of the mapping reads them in again.
void ReleaseMappedPages(std::span<const uint8_t> bytes);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_WEIGHT_MEMORY_H_
