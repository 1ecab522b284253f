// SendRing: a sender's registered memory for step payloads, cut into fixed slots. A slot holds
// one step's packed tensors from the moment the sender signals the receiver until the receiver
// acknowledges (or the slot is given up because its receiver is gone). A full ring is
// backpressure: Acquire returns nothing; a slot that is not acknowledged is never overwritten.
// Thread-compatible: owned by a StageNode's loop thread.
#ifndef CONNEX_PP_SEND_RING_H_
#define CONNEX_PP_SEND_RING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/transport/transfer_engine.h"

namespace connex::pp {

// Every slot starts with this header; the payload follows it. The correlation id in the header
// lets a receiver check that it read the payload it was signalled about (a late read of a
// reused slot is detected, not consumed).
struct SlotHeader {
  uint64_t corr;
  uint64_t length;  // payload bytes after the header
};
inline constexpr uint64_t kSlotHeaderBytes = 64;

class SendRing {
 public:
  // Allocates `slots` × `slot_bytes` of managed (registered) memory from `engine`.
  static absl::StatusOr<std::unique_ptr<SendRing>> Create(transport::TransferEngine& engine,
                                                          size_t slots, size_t slot_bytes);
  ~SendRing();

  // A free slot, now owned by `corr`; nullopt when every slot awaits an acknowledgement.
  std::optional<uint32_t> Acquire(uint64_t corr);
  // Frees the slot of `corr`; false when `corr` holds none (e.g. a duplicated ACK).
  bool Release(uint64_t corr);

  // Payload space of `slot` (after the header) and its size.
  uint8_t* payload(uint32_t slot) const;
  uint64_t payload_capacity() const { return slot_bytes_ - kSlotHeaderBytes; }
  // Writes the header after the payload is in place (a reader checks it first).
  void Seal(uint32_t slot, uint64_t corr, uint64_t length);
  // The address peers read the slot at (header included), and the bytes to read.
  uint64_t remote_addr(uint32_t slot) const;

  size_t in_use() const { return by_corr_.size(); }
  size_t slots() const { return free_.size() + by_corr_.size(); }

 private:
  SendRing(transport::TransferEngine& engine, uint8_t* base, size_t slots, size_t slot_bytes);
  transport::TransferEngine& engine_;
  uint8_t* base_;
  size_t slot_bytes_;
  std::vector<uint32_t> free_;
  std::map<uint64_t, uint32_t> by_corr_;
};

// The receiver's side of a slot: reads header and payload of the slot at `remote` (signalled
// with `corr` and `length`) from `peer` into `buffer` (registered, kSlotHeaderBytes + length
// bytes) with one one-sided read, then reads the header again into `check` (registered,
// kSlotHeaderBytes) — a seqlock: a sender that reuses the slot invalidates its header first, so a
// read that overlapped the reuse sees a changed header afterwards, even when the header it read
// first was still the right one. Aborted: the payload was replaced before or during the read
// (never consumed). Other codes are the transfer engine's.
absl::Status ReadSlot(transport::TransferEngine& engine, const transport::PeerRef& peer,
                      void* buffer, void* check, uint64_t remote, uint64_t corr, uint64_t length);

}  // namespace connex::pp

#endif  // CONNEX_PP_SEND_RING_H_
