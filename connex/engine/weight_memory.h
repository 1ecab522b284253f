// Where a stage engine keeps the weights it streams: copied into memory of its own (the default)
// or mapped from the checkpoint's files (CONNEX_ENGINE_WEIGHTS=mapped). Copied ones are read once
// at load into anonymous memory with transparent huge pages asked for (MADV_HUGEPAGE); mapped ones
// are page-cache pages, shared by every process that maps the same file and read in on first use.
// Copied is the default because a serving stage's weights must not go cold: on this project's
// machines a stage whose mapped weights sat unread for 100 s took ~530 ms for its next decode
// step instead of ~55 (copied: 54 ms; this VM's DAMON acts on idle file pages), and decode streams
// copied weights faster — a Llama-3.2-1B-shaped BF16 model at 0.92-0.97 of the memory bound against
// 0.87-0.92 mapped (docs/results.md, "Each thread its own half"). The copy costs the load a read of
// the stage's weights, and their memory is the process's own: replicas of a stage on one host that
// should share one copy run mapped. Bits do not depend on it.
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
// CONNEX_ENGINE_WEIGHTS, default copied; InvalidArgument names the variable and its value.
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
