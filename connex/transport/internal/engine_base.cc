#include "connex/transport/internal/engine_base.h"

#include <sys/mman.h>

#include <cstring>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "fmt/format.h"

namespace connex::transport::internal {

EngineBase::~EngineBase() = default;

absl::Status EngineBase::RegisterMemory(void* addr, size_t length) {
  RegionTable::Region region;
  region.base = reinterpret_cast<uint64_t>(addr);
  region.length = length;
  if (region.base == 0 || length == 0) {
    return absl::InvalidArgumentError(
        StrCat(name_, ": register: empty or null range ", RangeString(region.base, length)));
  }
  RegionTable::Region hooked = region;
  if (absl::Status s = OnRegister(hooked); !s.ok()) return s;
  absl::Status s = regions_.Register(hooked);
  if (!s.ok()) {
    OnUnregister(hooked);
    return Annotate(s, name_);
  }
  return absl::OkStatus();
}

absl::Status EngineBase::UnregisterMemory(void* addr) {
  uint64_t base = reinterpret_cast<uint64_t>(addr);
  std::optional<RegionTable::Region> found = regions_.Find(base);
  if (found && found->managed) {
    return absl::InvalidArgumentError(
        StrCat(name_, ": unregister: ", RangeString(base, found->length),
               " is a managed buffer; free it with FreeManagedBuffer"));
  }
  absl::StatusOr<RegionTable::Region> region = regions_.Unregister(base);
  if (!region.ok()) return Annotate(region.status(), name_);
  OnUnregister(*region);
  return absl::OkStatus();
}

absl::StatusOr<EngineBase::Backing> EngineBase::AllocateBacking(size_t length) {
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(StrCat(name_, ": cannot allocate a managed buffer of ",
                                               length, " bytes: ", std::strerror(errno)));
  }
  return Backing{p, 0};
}

void EngineBase::FreeBacking(void* addr, size_t length, uint64_t /*cookie*/) {
  munmap(addr, length);
}

absl::StatusOr<void*> EngineBase::AllocateManagedBuffer(size_t length) {
  if (length == 0) {
    return absl::InvalidArgumentError(StrCat(name_, ": managed buffer of 0 bytes"));
  }
  CONNEX_ASSIGN_OR_RETURN(Backing backing, AllocateBacking(length));
  RegionTable::Region region;
  region.base = reinterpret_cast<uint64_t>(backing.addr);
  region.length = length;
  region.cookie = backing.cookie;
  region.managed = true;
  absl::Status s = OnRegister(region);
  if (s.ok()) {
    s = regions_.Register(region);
    if (!s.ok()) OnUnregister(region);
  }
  if (!s.ok()) {
    FreeBacking(backing.addr, length, backing.cookie);
    return Annotate(s, name_);
  }
  return backing.addr;
}

absl::Status EngineBase::FreeManagedBuffer(void* buffer) {
  uint64_t base = reinterpret_cast<uint64_t>(buffer);
  std::optional<RegionTable::Region> found = regions_.Find(base);
  if (!found || !found->managed) {
    return absl::InvalidArgumentError(
        fmt::format("{}: free: {:#x} is not a managed buffer", name_, base));
  }
  absl::StatusOr<RegionTable::Region> region = regions_.Unregister(base);
  if (!region.ok()) return Annotate(region.status(), name_);
  OnUnregister(*region);
  FreeBacking(buffer, region->length, region->cookie);
  return absl::OkStatus();
}

void EngineBase::FreeAllManagedBuffers() {
  for (const RegionTable::Region& r : regions_.List()) {
    if (r.managed) {
      (void)FreeManagedBuffer(reinterpret_cast<void*>(r.base));
    } else {
      (void)UnregisterMemory(reinterpret_cast<void*>(r.base));
    }
  }
}

absl::Status EngineBase::CopyToManagedBuffer(void* dst, const void* src, size_t length) {
  if (length == 0) return absl::OkStatus();
  CONNEX_ASSIGN_OR_RETURN(RegionTable::Pin pin,
                          regions_.Acquire(reinterpret_cast<uint64_t>(dst), length, "managed"));
  if (!pin.region().managed) {
    return absl::InvalidArgumentError(StrCat(name_, ": copy: destination ",
                                             RangeString(reinterpret_cast<uint64_t>(dst), length),
                                             " is registered but not a managed buffer"));
  }
  std::memcpy(dst, src, length);
  return absl::OkStatus();
}

absl::Status EngineBase::CopyFromManagedBuffer(void* dst, const void* src, size_t length) {
  if (length == 0) return absl::OkStatus();
  CONNEX_ASSIGN_OR_RETURN(RegionTable::Pin pin,
                          regions_.Acquire(reinterpret_cast<uint64_t>(src), length, "managed"));
  if (!pin.region().managed) {
    return absl::InvalidArgumentError(StrCat(name_, ": copy: source ",
                                             RangeString(reinterpret_cast<uint64_t>(src), length),
                                             " is registered but not a managed buffer"));
  }
  std::memcpy(dst, src, length);
  return absl::OkStatus();
}

uint64_t EngineBase::SubscribePeerEvents(PeerEventCallback cb) {
  return events_.Subscribe(std::move(cb));
}

void EngineBase::UnsubscribePeerEvents(uint64_t id) { events_.Unsubscribe(id); }

}  // namespace connex::transport::internal
