// StepSender: the sending side of the step protocol on one node — the send ring's slots, the
// signals waiting for a slot (backpressure, in order), and the slots waiting for their
// acknowledgement. It is the one place that gives a slot up: on the receiver's ACK, on the
// target's death, or after the step timeout without an acknowledgement (a reader that comes
// late is stopped by the slot header, see ReadSlot). Every send that cannot be delivered ends in
// one call of the `HopFailed` callback, which the node hands to the step's owner.
// Thread-compatible: owned by a StageNode's loop thread.
#ifndef CONNEX_PP_STEP_SENDER_H_
#define CONNEX_PP_STEP_SENDER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/clock.h"
#include "connex/base/lid.h"
#include "connex/pp/messages.h"
#include "connex/pp/send_ring.h"
#include "connex/pp/tensor_dict.h"

namespace connex::pp {

// A step to send: the signal (everything but corr, layout, remote_addr and length, which the
// sender fills in) and its payload.
struct PendingSend {
  StepSignal signal;
  TensorDict payload;
};

// Why a send of step (owner, step, attempt, ticket) to route[hop] failed.
struct SendFailure {
  Hop owner;  // lid and signal address
  uint64_t step = 0;
  uint32_t attempt = 0;
  uint64_t ticket = 0;
  uint32_t hop = 0;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string reason;
};

// The send of step `step` to its next hop after this stage ran (or replayed) it: the same step
// one hop on, from `origin` (this stage), with `output` as payload and the requests of its batch
// (those that ran here, not those reported missing). InvalidArgument naming the step when it has
// no hop after this one or `output` no valid batch.
absl::StatusOr<PendingSend> NextHop(const StepSignal& step, TensorDict output, const Hop& origin);

struct StepSenderOptions {
  Lid self;                       // for messages
  int64_t ack_timeout_ms = 5000;  // a slot not acknowledged this long is given up
  Clock* clock = nullptr;         // nullptr: the real clock
  uint64_t first_corr = 1;        // correlation ids count up from here
};

class StepSender {
 public:
  using SendSignal = std::function<void(const std::string& address, const Signal& signal)>;
  using OnFailure = std::function<void(const SendFailure& failure)>;

  // `ring` is this node's send ring; `send` delivers a signal; `on_failure` runs (on the
  // caller's thread, inside the call that found it) for every send that failed.
  StepSender(StepSenderOptions options, std::unique_ptr<SendRing> ring, SendSignal send,
             OnFailure on_failure);

  // Sends `p` now, or queues it behind earlier ones until a slot frees. A payload that no slot
  // can hold fails at once (ResourceExhausted, naming CONNEX_PP_SLOT_BYTES).
  void Forward(PendingSend p);
  // Sends queued steps while slots are free.
  void Flush();
  // The receiver's answer: frees the slot; a refusal (code != 0) is a failure. An ACK for an
  // unknown correlation id (late, duplicated) changes nothing; one from another LID than the
  // slot's target is not believed (returns false).
  bool OnAck(const AckSignal& ack);
  // Gives up the slots whose acknowledgement is overdue (DeadlineExceeded failures).
  void Expire(int64_t now_ms);
  // `lid` died: its slots are free, their sends failed (Unavailable, `why`).
  void PeerGone(const Lid& lid, const std::string& why);

  // The earliest acknowledgement deadline, or `otherwise`.
  int64_t NextDeadline(int64_t otherwise) const;
  uint64_t payload_capacity() const { return ring_->payload_capacity(); }
  size_t slots_in_use() const { return ring_->in_use(); }
  size_t queued() const { return pending_.size(); }
  size_t awaiting_ack() const { return outgoing_.size(); }
  uint64_t backpressured() const { return backpressured_; }

 private:
  struct Outgoing {
    SendFailure failure;  // what to report if it fails (code and reason filled in then)
    Lid target;
    int64_t deadline = 0;
  };
  bool TrySend(PendingSend& p);
  void Fail(uint64_t corr, absl::StatusCode code, const std::string& reason);
  int64_t NowMs() const { return clock_->NowMs(); }

  const StepSenderOptions o_;
  Clock* const clock_;
  std::unique_ptr<SendRing> ring_;
  SendSignal send_;
  OnFailure on_failure_;
  uint64_t next_corr_;
  std::map<uint64_t, Outgoing> outgoing_;
  std::deque<PendingSend> pending_;
  uint64_t backpressured_ = 0;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_STEP_SENDER_H_
