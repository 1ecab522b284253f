#include "connex/pp/internal/read_buffers.h"

#include <utility>

#include "connex/base/status.h"
#include "connex/pp/send_ring.h"

namespace connex::pp::internal {

void LoopHandoff::ReadThen(const std::function<void()>& read, std::function<void()> rest) const {
  if (!enabled()) {
    read();
    rest();
  } else if (blocking(read)) {
    rest();
  } else {
    (void)post(std::move(rest), nullptr);  // the loop stopped: dropped with it
  }
}

ReadBuffers::~ReadBuffers() {
  for (const Buffer& b : all_) {
    (void)transfer_.FreeManagedBuffer(b.slot);
    if (b.check != nullptr) (void)transfer_.FreeManagedBuffer(b.check);
  }
}

absl::StatusOr<ReadBuffers::Buffer> ReadBuffers::Take() {
  if (!free_.empty()) {
    Buffer b = free_.back();
    free_.pop_back();
    return b;
  }
  Buffer b;
  CONNEX_ASSIGN_OR_RETURN(b.slot, transfer_.AllocateManagedBuffer(slot_bytes_));
  all_.push_back(b);
  CONNEX_ASSIGN_OR_RETURN(b.check, transfer_.AllocateManagedBuffer(kSlotHeaderBytes));
  all_.back() = b;
  return b;
}

}  // namespace connex::pp::internal
