#include "connex/transport/internal/region_table.h"

#include <utility>

#include "connex/base/strings.h"
#include "fmt/format.h"

namespace connex::transport::internal {

std::string RangeString(uint64_t addr, uint64_t length) {
  return fmt::format("[{:#x}, +{})", addr, length);
}

RegionTable::Pin& RegionTable::Pin::operator=(Pin&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = other.table_;
    entry_ = other.entry_;
    other.table_ = nullptr;
    other.entry_ = nullptr;
  }
  return *this;
}

const RegionTable::Region& RegionTable::Pin::region() const { return entry_->region; }

void RegionTable::Pin::Release() {
  if (entry_ == nullptr) return;
  MutexLock lock(&table_->mu_);
  --entry_->pins;
  entry_ = nullptr;
  table_ = nullptr;
}

RegionTable::~RegionTable() = default;

absl::Status RegionTable::Register(const Region& region) {
  if (region.base == 0 || region.length == 0) {
    return absl::InvalidArgumentError(
        StrCat("register: empty or null range ", RangeString(region.base, region.length)));
  }
  if (region.base + region.length < region.base) {
    return absl::InvalidArgumentError(
        StrCat("register: range ", RangeString(region.base, region.length), " wraps around"));
  }
  MutexLock lock(&mu_);
  auto next = regions_.lower_bound(region.base);
  if (next != regions_.end() && next->first < region.base + region.length) {
    return absl::InvalidArgumentError(
        StrCat("register: range ", RangeString(region.base, region.length), " overlaps registered ",
               RangeString(next->second->region.base, next->second->region.length)));
  }
  if (next != regions_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second->region.length > region.base) {
      return absl::InvalidArgumentError(StrCat(
          "register: range ", RangeString(region.base, region.length), " overlaps registered ",
          RangeString(prev->second->region.base, prev->second->region.length)));
    }
  }
  auto entry = std::make_unique<Pin::Entry>();
  entry->region = region;
  regions_.emplace(region.base, std::move(entry));
  return absl::OkStatus();
}

absl::StatusOr<RegionTable::Region> RegionTable::Unregister(uint64_t base) {
  std::unique_ptr<Pin::Entry> entry;
  MutexLock lock(&mu_);
  auto it = regions_.find(base);
  if (it == regions_.end()) {
    return absl::InvalidArgumentError(
        fmt::format("unregister: no registered range starts at {:#x}", base));
  }
  entry = std::move(it->second);
  regions_.erase(it);
  Pin::Entry* raw = entry.get();
  auto drained = [raw]() { return raw->pins == 0; };
  mu_.Await(absl::Condition(&drained));
  return entry->region;
}

absl::StatusOr<RegionTable::Pin> RegionTable::Acquire(uint64_t addr, uint64_t length,
                                                      std::string_view what) {
  MutexLock lock(&mu_);
  auto it = regions_.upper_bound(addr);
  if (it != regions_.begin()) {
    --it;
    const Region& r = it->second->region;
    if (addr >= r.base && addr + length >= addr && addr + length <= r.base + r.length) {
      ++it->second->pins;
      return Pin(this, it->second.get());
    }
  }
  return absl::InvalidArgumentError(
      StrCat(what, " range ", RangeString(addr, length), " is not registered"));
}

std::optional<RegionTable::Region> RegionTable::Find(uint64_t base) const {
  MutexLock lock(&mu_);
  auto it = regions_.find(base);
  if (it == regions_.end()) return std::nullopt;
  return it->second->region;
}

std::vector<RegionTable::Region> RegionTable::List() const {
  MutexLock lock(&mu_);
  std::vector<Region> out;
  for (const auto& [base, entry] : regions_) out.push_back(entry->region);
  return out;
}

}  // namespace connex::transport::internal
