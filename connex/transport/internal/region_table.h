// RegionTable: the registered memory ranges of one engine, with pins that keep a range
// registered while a read uses it. Shared by every backend. Thread-safe.
#ifndef CONNEX_TRANSPORT_INTERNAL_REGION_TABLE_H_
#define CONNEX_TRANSPORT_INTERNAL_REGION_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/mutex.h"

namespace connex::transport::internal {

// "[0x7f00, +4096)" — how errors name a range.
std::string RangeString(uint64_t addr, uint64_t length);

class RegionTable {
 public:
  struct Region {
    uint64_t base = 0;
    uint64_t length = 0;
    uint64_t cookie = 0;  // backend data (e.g. shm segment id); 0 when unused
    bool managed = false;
  };

  // Keeps one region registered until destroyed. Movable.
  class Pin {
   public:
    Pin() = default;
    Pin(Pin&& other) noexcept : table_(other.table_), entry_(other.entry_) {
      other.table_ = nullptr;
      other.entry_ = nullptr;
    }
    Pin& operator=(Pin&& other) noexcept;
    ~Pin() { Release(); }
    const Region& region() const;
    explicit operator bool() const { return entry_ != nullptr; }

   private:
    friend class RegionTable;
    struct Entry {
      Region region;
      int pins = 0;  // guarded by the table's mutex
    };
    Pin(RegionTable* table, Entry* entry) : table_(table), entry_(entry) {}
    void Release();
    RegionTable* table_ = nullptr;
    Entry* entry_ = nullptr;
  };

  RegionTable() = default;
  ~RegionTable();
  RegionTable(const RegionTable&) = delete;
  RegionTable& operator=(const RegionTable&) = delete;

  // InvalidArgument when empty, null, or overlapping a registered range.
  absl::Status Register(const Region& region);
  // Removes the range starting at `base` and waits until no Pin holds it. InvalidArgument when
  // no range starts there. Returns the removed region.
  absl::StatusOr<Region> Unregister(uint64_t base);
  // Pins the region containing [addr, addr+length). InvalidArgument names the range and `what`
  // ("local", "remote", ...) when it is not inside one registered region.
  absl::StatusOr<Pin> Acquire(uint64_t addr, uint64_t length, std::string_view what);
  // The region that starts exactly at `base`, if any (not pinned).
  std::optional<Region> Find(uint64_t base) const;
  // Every region (for cleanup at shutdown).
  std::vector<Region> List() const;

 private:
  mutable Mutex mu_;
  // Keyed by base address.
  std::map<uint64_t, std::unique_ptr<Pin::Entry>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace connex::transport::internal

#endif  // CONNEX_TRANSPORT_INTERNAL_REGION_TABLE_H_
