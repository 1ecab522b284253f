#include "connex/engine/weight_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "connex/base/config.h"
#include "connex/base/strings.h"

namespace connex::engine {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlign = 64;

}  // namespace

std::string_view WeightMemoryName(WeightMemory m) {
  return m == WeightMemory::kCopied ? "copied" : "mapped";
}

absl::StatusOr<WeightMemory> ParseWeightMemory(std::string_view text) {
  if (text == "mapped") return WeightMemory::kMapped;
  if (text == "copied") return WeightMemory::kCopied;
  return absl::InvalidArgumentError(
      StrCat("weights: \"", text, "\" is neither \"mapped\" nor \"copied\""));
}

absl::StatusOr<WeightMemory> WeightMemoryFromEnv() {
  std::optional<std::string> v = GetEnv("CONNEX_ENGINE_WEIGHTS");
  if (!v) return WeightMemory::kCopied;
  absl::StatusOr<WeightMemory> m = ParseWeightMemory(*v);
  if (!m.ok()) {
    return absl::InvalidArgumentError(
        StrCat("CONNEX_ENGINE_WEIGHTS=", *v, ": neither \"mapped\" nor \"copied\""));
  }
  return m;
}

WeightArena::~WeightArena() {
  for (const Chunk& c : chunks_) ::munmap(c.base, c.size);
}

absl::StatusOr<std::span<const uint8_t>> WeightArena::Copy(std::span<const uint8_t> bytes) {
  const size_t n = std::max<size_t>(bytes.size(), 1);
  if (chunks_.empty() || chunks_.back().size - chunks_.back().used < n) {
    // Whole huge pages, so that the chunk's end can be one too.
    const size_t size = (std::max(chunk_bytes_, n) + kHugePage - 1) / kHugePage * kHugePage;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return absl::ResourceExhaustedError(StrCat(
          "weights: cannot map ", size, " bytes to copy weights into: ", std::strerror(err)));
    }
    // Only advice: without transparent huge pages (or with them off) the copy still works.
    (void)::madvise(p, size, MADV_HUGEPAGE);
    chunks_.push_back(Chunk{static_cast<uint8_t*>(p), size, 0});
  }
  Chunk& c = chunks_.back();
  uint8_t* out = c.base + c.used;
  if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
  c.used = std::min(c.size, (c.used + n + kAlign - 1) / kAlign * kAlign);
  bytes_ += static_cast<int64_t>(bytes.size());
  return std::span<const uint8_t>(out, bytes.size());
}

void ReleaseMappedPages(std::span<const uint8_t> bytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) / page * page;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace connex::engine
