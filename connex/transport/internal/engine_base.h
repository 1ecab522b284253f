// EngineBase: what every backend shares — registered and managed memory, copies, and the
// peer-event subscribers. A backend derives from it and implements reads, addresses, Connect,
// and (when managed memory must be special, e.g. shared memory) the two allocation hooks.
// Thread-safe.
#ifndef CONNEX_TRANSPORT_INTERNAL_ENGINE_BASE_H_
#define CONNEX_TRANSPORT_INTERNAL_ENGINE_BASE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/transport/internal/event_hub.h"
#include "connex/transport/internal/region_table.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport::internal {

class EngineBase : public TransferEngine {
 public:
  explicit EngineBase(std::string name) : name_(std::move(name)) {}
  ~EngineBase() override;

  absl::Status RegisterMemory(void* addr, size_t length) override;
  absl::Status UnregisterMemory(void* addr) override;
  absl::StatusOr<void*> AllocateManagedBuffer(size_t length) override;
  absl::Status FreeManagedBuffer(void* buffer) override;
  absl::Status CopyToManagedBuffer(void* dst, const void* src, size_t length) override;
  absl::Status CopyFromManagedBuffer(void* dst, const void* src, size_t length) override;
  uint64_t SubscribePeerEvents(PeerEventCallback cb) override;
  void UnsubscribePeerEvents(uint64_t id) override;

  RegionTable& regions() { return regions_; }
  EventHub& events() { return events_; }
  const std::string& name() const { return name_; }

 protected:
  struct Backing {
    void* addr = nullptr;
    uint64_t cookie = 0;  // backend's handle, handed back to FreeBacking
  };
  // Allocates memory for a managed buffer (default: page-aligned heap memory).
  virtual absl::StatusOr<Backing> AllocateBacking(size_t length);
  virtual void FreeBacking(void* addr, size_t length, uint64_t cookie);
  // Called after a range is registered / before its registration is dropped (after pins drain);
  // e.g. the ucx backend maps it with UCX. Defaults do nothing.
  virtual absl::Status OnRegister(RegionTable::Region& /*region*/) { return absl::OkStatus(); }
  virtual void OnUnregister(const RegionTable::Region& /*region*/) {}
  // Frees every managed buffer; a derived destructor calls it while its hooks still work.
  void FreeAllManagedBuffers();

 private:
  std::string name_;
  RegionTable regions_;
  EventHub events_;
};

}  // namespace connex::transport::internal

#endif  // CONNEX_TRANSPORT_INTERNAL_ENGINE_BASE_H_
