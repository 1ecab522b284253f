// ReadBuffers: the registered buffers one-sided reads of ring slots land in (ReadSlot: header and
// payload, and the header read again), one per read in progress — more than one only while a
// read hangs on a thread that lost the loop (loop_baton.h). And LoopHandoff, how a reader learns
// whether it still runs the loop after a read and hands the rest over when not.
// Thread-compatible (the loop's).
#ifndef CONNEX_PP_INTERNAL_READ_BUFFERS_H_
#define CONNEX_PP_INTERNAL_READ_BUFFERS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/transport/transfer_engine.h"

namespace connex::pp::internal {

// With both set, a read may outlast the caller's hold on the loop: `blocking` runs it and says
// whether the caller still runs the loop after it; when it does not, the rest goes to the loop
// through `post` (false: the loop stopped, it is dropped). Unset: a read blocks the caller.
struct LoopHandoff {
  std::function<bool(const std::function<void()>& read)> blocking;
  std::function<bool(std::function<void()> run, std::function<void()> cancel)> post;
  bool enabled() const { return blocking && post; }
  // Runs `read` (blocking; it must touch no loop state), then `rest` on the loop: here when this
  // thread still runs it (or no handoff is set), else posted to the thread that took it over.
  void ReadThen(const std::function<void()>& read, std::function<void()> rest) const;
};

class ReadBuffers {
 public:
  struct Buffer {
    void* slot = nullptr;   // kSlotHeaderBytes + the largest payload
    void* check = nullptr;  // kSlotHeaderBytes
  };

  // Buffers of `slot_bytes` from `transfer`, which must outlive it.
  ReadBuffers(transport::TransferEngine& transfer, int64_t slot_bytes)
      : transfer_(transfer), slot_bytes_(slot_bytes) {}
  ~ReadBuffers();
  ReadBuffers(const ReadBuffers&) = delete;
  ReadBuffers& operator=(const ReadBuffers&) = delete;

  // A free buffer, allocated when none is (the allocation's error otherwise).
  absl::StatusOr<Buffer> Take();
  void Give(Buffer b) { free_.push_back(b); }

 private:
  transport::TransferEngine& transfer_;
  const int64_t slot_bytes_;
  std::vector<Buffer> all_, free_;
};

}  // namespace connex::pp::internal

#endif  // CONNEX_PP_INTERNAL_READ_BUFFERS_H_
