#include "connex/pp/send_ring.h"

#include <atomic>
#include <cstring>

#include "connex/base/check.h"
#include "connex/base/strings.h"

namespace connex::pp {

absl::StatusOr<std::unique_ptr<SendRing>> SendRing::Create(transport::TransferEngine& engine,
                                                           size_t slots, size_t slot_bytes) {
  if (slots == 0 || slot_bytes <= kSlotHeaderBytes || slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(StrCat("send ring: ", slots, " slots of ", slot_bytes,
                                             " bytes (need >= 1 slot of a multiple of 64 > 64)"));
  }
  absl::StatusOr<void*> base = engine.AllocateManagedBuffer(slots * slot_bytes);
  if (!base.ok()) return base.status();
  return std::unique_ptr<SendRing>(
      new SendRing(engine, static_cast<uint8_t*>(*base), slots, slot_bytes));
}

SendRing::SendRing(transport::TransferEngine& engine, uint8_t* base, size_t slots,
                   size_t slot_bytes)
    : engine_(engine), base_(base), slot_bytes_(slot_bytes) {
  for (size_t i = slots; i > 0; --i) free_.push_back(static_cast<uint32_t>(i - 1));
}

SendRing::~SendRing() { (void)engine_.FreeManagedBuffer(base_); }

std::optional<uint32_t> SendRing::Acquire(uint64_t corr) {
  if (free_.empty() || by_corr_.count(corr)) return std::nullopt;
  uint32_t slot = free_.back();
  free_.pop_back();
  by_corr_.emplace(corr, slot);
  // Invalidate the header first: a late reader of the previous payload sees a mismatch.
  SlotHeader h{0, 0};
  std::memcpy(base_ + static_cast<size_t>(slot) * slot_bytes_, &h, sizeof(h));
  std::atomic_thread_fence(std::memory_order_release);
  return slot;
}

bool SendRing::Release(uint64_t corr) {
  auto it = by_corr_.find(corr);
  if (it == by_corr_.end()) return false;
  free_.push_back(it->second);
  by_corr_.erase(it);
  return true;
}

uint8_t* SendRing::payload(uint32_t slot) const {
  return base_ + static_cast<size_t>(slot) * slot_bytes_ + kSlotHeaderBytes;
}

void SendRing::Seal(uint32_t slot, uint64_t corr, uint64_t length) {
  // Only the holder of a slot seals it, with a payload that fits.
  auto held = by_corr_.find(corr);
  CONNEX_CHECK(held != by_corr_.end() && held->second == slot);
  CONNEX_CHECK(length <= payload_capacity());
  std::atomic_thread_fence(std::memory_order_release);
  SlotHeader h{corr, length};
  std::memcpy(base_ + static_cast<size_t>(slot) * slot_bytes_, &h, sizeof(h));
}

uint64_t SendRing::remote_addr(uint32_t slot) const {
  return reinterpret_cast<uint64_t>(base_ + static_cast<size_t>(slot) * slot_bytes_);
}

absl::Status ReadSlot(transport::TransferEngine& engine, const transport::PeerRef& peer,
                      void* buffer, void* check, uint64_t remote, uint64_t corr, uint64_t length) {
  auto matches = [corr, length](const void* at) {
    SlotHeader h{};
    std::memcpy(&h, at, sizeof(h));
    return h.corr == corr && h.length == length;
  };
  absl::Status read = engine.TransferSyncRead(peer, buffer, remote, kSlotHeaderBytes + length);
  if (!read.ok()) return read;
  if (!matches(buffer)) {
    return absl::AbortedError("payload was replaced before it was read (stale slot)");
  }
  read = engine.TransferSyncRead(peer, check, remote, kSlotHeaderBytes);
  if (!read.ok()) return read;
  if (!matches(check)) {
    return absl::AbortedError("payload was replaced while it was read (stale slot)");
  }
  return absl::OkStatus();
}

}  // namespace connex::pp
