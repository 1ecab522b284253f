#include "connex/pp/step_sender.h"

#include <algorithm>
#include <vector>

#include "connex/base/strings.h"
#include "connex/pp/engine.h"

namespace connex::pp {

absl::StatusOr<PendingSend> NextHop(const StepSignal& s, TensorDict output, const Hop& origin) {
  if (s.hop + 1 >= s.route.size()) {
    return absl::InvalidArgumentError(StrCat("step ", s.step, " has no hop after ", s.hop));
  }
  absl::StatusOr<Batch> b = GetBatch(output);
  if (!b.ok()) {
    return absl::InvalidArgumentError(StrCat("the engine's output of step ", s.step,
                                             " has no valid batch: ", b.status().message()));
  }
  PendingSend p;
  p.signal = s;
  p.signal.hop = s.hop + 1;
  p.signal.origin = origin;
  p.signal.request_ids = b->request_ids;
  p.signal.start_positions = b->start_positions;
  p.signal.num_tokens = b->num_tokens;
  p.payload = std::move(output);
  return p;
}

StepSender::StepSender(StepSenderOptions options, std::unique_ptr<SendRing> ring, SendSignal send,
                       OnFailure on_failure)
    : o_(std::move(options)),
      clock_(o_.clock != nullptr ? o_.clock : RealClock::Get()),
      ring_(std::move(ring)),
      send_(std::move(send)),
      on_failure_(std::move(on_failure)),
      next_corr_(o_.first_corr) {}

void StepSender::Forward(PendingSend p) {
  if (!pending_.empty() || !TrySend(p)) {
    ++backpressured_;
    pending_.push_back(std::move(p));
  }
}

void StepSender::Flush() {
  while (!pending_.empty() && TrySend(pending_.front())) pending_.pop_front();
}

bool StepSender::TrySend(PendingSend& p) {
  StepSignal& s = p.signal;
  SendFailure failure{s.owner, s.step, s.attempt, s.ticket, s.hop, absl::StatusCode::kUnknown, ""};
  uint64_t size = PackedSize(p.payload);
  if (size > ring_->payload_capacity()) {
    // No slot will ever hold it: a permanent error, the owner ends the requests.
    failure.code = absl::StatusCode::kResourceExhausted;
    failure.reason =
        StrCat(o_.self.ToString(), ": step payload of ", size, " bytes exceeds a ring slot (",
               ring_->payload_capacity(), " bytes; raise CONNEX_PP_SLOT_BYTES)");
    on_failure_(failure);
    return true;
  }
  uint64_t corr = next_corr_++;
  std::optional<uint32_t> slot = ring_->Acquire(corr);
  if (!slot) return false;
  s.layout = Pack(p.payload, ring_->payload(*slot));
  ring_->Seal(*slot, corr, size);
  s.corr = corr;
  s.remote_addr = ring_->remote_addr(*slot);
  s.length = size;
  const Hop& target = s.target();
  outgoing_[corr] = Outgoing{failure, target.lid, NowMs() + o_.ack_timeout_ms};
  send_(target.signal, s);
  return true;
}

void StepSender::Fail(uint64_t corr, absl::StatusCode code, const std::string& reason) {
  auto it = outgoing_.find(corr);
  if (it == outgoing_.end()) return;
  SendFailure failure = std::move(it->second.failure);
  outgoing_.erase(it);
  ring_->Release(corr);
  failure.code = code;
  failure.reason = reason;
  on_failure_(failure);
}

bool StepSender::OnAck(const AckSignal& ack) {
  auto it = outgoing_.find(ack.corr);
  if (it == outgoing_.end()) return true;  // late or duplicated: the slot is not touched
  if (ack.from != it->second.target) return false;
  if (ack.code == 0) {
    outgoing_.erase(it);
    ring_->Release(ack.corr);
    return true;
  }
  Fail(ack.corr, static_cast<absl::StatusCode>(ack.code), ack.message);
  return true;
}

void StepSender::Expire(int64_t now_ms) {
  std::vector<uint64_t> expired;
  for (const auto& [corr, out] : outgoing_) {
    if (out.deadline <= now_ms) expired.push_back(corr);
  }
  for (uint64_t corr : expired)
    Fail(corr, absl::StatusCode::kDeadlineExceeded, "no acknowledgement");
}

void StepSender::PeerGone(const Lid& lid, const std::string& why) {
  std::vector<uint64_t> gone;
  for (const auto& [corr, out] : outgoing_) {
    if (out.target == lid) gone.push_back(corr);
  }
  for (uint64_t corr : gone) Fail(corr, absl::StatusCode::kUnavailable, why);
}

int64_t StepSender::NextDeadline(int64_t otherwise) const {
  int64_t next = otherwise;
  for (const auto& [corr, out] : outgoing_) next = std::min(next, out.deadline);
  return next;
}

}  // namespace connex::pp
