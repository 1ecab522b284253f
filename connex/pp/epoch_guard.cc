#include "connex/pp/epoch_guard.h"

#include <utility>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/strings.h"
#include "connex/directory/client.h"

namespace connex::pp {

std::optional<int64_t> DirectoryLease::RenewalAgeMs() const { return dir_.RenewalAgeMs(lid_); }
std::optional<int64_t> DirectoryLease::LeaseLeftMs() const { return dir_.LeaseLeftMs(lid_); }
int64_t DirectoryLease::heartbeat_ms() const { return dir_.heartbeat_ms(); }
absl::StatusOr<uint64_t> DirectoryLease::Renew() { return dir_.Renew(lid_); }

EpochGuard::EpochGuard(std::string name, const Clock* clock, int64_t stall_ms,
                       internal::Registration* registration, LeaseSource* lease)
    : name_(std::move(name)),
      clock_(clock),
      stall_ms_(stall_ms),
      reg_(registration),
      lease_(lease) {
  CONNEX_CHECK(clock_ != nullptr && reg_ != nullptr && lease_ != nullptr);
  CONNEX_CHECK(stall_ms_ > 0);
}

// Peers need longer than the stall bound to declare a stage dead, so a step admitted without a
// stall runs under an epoch nobody evicted for lack of answers from this process.
void EpochGuard::NoteAlive() {
  const int64_t now = clock_->NowMs();
  if (alive_ms_ != 0 && now - alive_ms_ > stall_ms_ && unconfirmed_epoch_ == 0 &&
      reg_->epoch() != 0) {
    unconfirmed_epoch_ = reg_->epoch();
    stalled_ms_ = now - alive_ms_;
    next_confirm_ms_ = 0;
    CONNEX_LOG_INFO(
        "pp {}: no progress for {} ms: epoch {} is confirmed with the directory before the next "
        "step",
        name_, stalled_ms_, unconfirmed_epoch_);
  }
  alive_ms_ = now;
}

absl::Status EpochGuard::Admit(uint64_t epoch) {
  NoteAlive();  // a freeze right before this step counts
  if (reg_->lease->evicted_epoch() == epoch) {
    return absl::FailedPreconditionError(
        StrCat("the directory evicted it (", reg_->lease->eviction(), "); joining again"));
  }
  if (refused_epoch_ == epoch) {
    return absl::FailedPreconditionError(StrCat("the directory evicted it (", refused_why_, ")"));
  }
  if (unconfirmed_epoch_ == 0) {
    // Cut off rather than frozen (a partition: the loop ran on, but neither the directory nor
    // the peers heard from it): a heartbeat that should have renewed the lease by now did not,
    // so the peers may have replaced it meanwhile — unless they answer (OnTheLease).
    std::optional<int64_t> age = lease_->RenewalAgeMs();
    if (!age || *age <= lease_->heartbeat_ms() + stall_ms_) {
      if (on_lease_since_ms_ != 0) {
        CONNEX_LOG_WARN("pp {}: the directory renewed epoch {} again; {} steps ran on the lease",
                        name_, epoch, stats_.steps_on_lease - on_lease_steps_at_start_);
        on_lease_since_ms_ = 0;
      }
      return absl::OkStatus();
    }
    if (OnTheLease(epoch, *age)) return absl::OkStatus();
    unconfirmed_epoch_ = epoch;
    stalled_ms_ = *age;
    next_confirm_ms_ = 0;
    CONNEX_LOG_INFO(
        "pp {}: the lease of epoch {} was not renewed for {} ms: it is confirmed with the "
        "directory before the next step",
        name_, epoch, *age);
  }
  if (unconfirmed_epoch_ != epoch) {
    unconfirmed_epoch_ = 0;  // a new epoch, joined after the stall
    return absl::OkStatus();
  }
  const int64_t now = clock_->NowMs();
  if (now < next_confirm_ms_) {
    return absl::UnavailableError(StrCat("this stage stalled ", stalled_ms_,
                                         " ms and the directory could not confirm its epoch yet"));
  }
  ++stats_.epoch_checks;
  absl::StatusOr<uint64_t> held = lease_->Renew();
  NoteAlive();  // the round trip is not a stall
  if (held.ok() && *held == epoch) {
    CONNEX_LOG_INFO("pp {}: epoch {} confirmed after a stall of {} ms", name_, epoch, stalled_ms_);
    unconfirmed_epoch_ = 0;
    return absl::OkStatus();
  }
  if (held.ok()) {
    // A JOIN of ours whose reply was lost: the client's lease holds the new epoch now.
    return absl::FailedPreconditionError(StrCat("the directory holds epoch ", *held, " now"));
  }
  if (held.status().code() == absl::StatusCode::kFailedPrecondition ||
      held.status().code() == absl::StatusCode::kNotFound) {
    refused_epoch_ = epoch;
    refused_why_ = StrCat("no longer current after a stall of ", stalled_ms_,
                          " ms: ", held.status().message());
    return absl::FailedPreconditionError(StrCat("the directory evicted it (", refused_why_, ")"));
  }
  next_confirm_ms_ = now + stall_ms_;  // unreachable: refuse meanwhile, ask again later
  return absl::UnavailableError(
      StrCat("this stage stalled ", stalled_ms_,
             " ms and the directory could not confirm its epoch: ", held.status().message()));
}

// A step may run without asking the directory while its lease is unrenewed (the directory is
// down, restarting or slow, or unreachable from here) as long as both hold:
//  - the lease cannot have run out (LeaseLeftMs, less a stall bound of margin for the renewal's
//    round trip and the directory's expiry sweep): the directory expires a lease a TTL after the
//    renewal it last acknowledged, a restarted one gives every restored lease a whole TTL, and
//    etcd keeps a lease across a leader change;
//  - a member this node deals with was heard from within the stall bound before this step: a
//    peer reports a stage only after a probe timeout without an answer, longer than that bound,
//    so a stage that was cut off from its peers too (a partition) confirms with the directory as
//    before.
// What it leaves: a stage cut off from the directory and one peer but not another could run a
// step after the cut-off peer's report evicted it; the owner drops that attempt's answer.
bool EpochGuard::OnTheLease(uint64_t epoch, int64_t age_ms) {
  const int64_t now = clock_->NowMs();
  const std::optional<int64_t> lease_left_ms = lease_->LeaseLeftMs();
  if (!lease_left_ms || *lease_left_ms - stall_ms_ <= 0 || peer_heard_ms_ == 0 ||
      now - peer_heard_ms_ > stall_ms_) {
    return false;
  }
  ++stats_.steps_on_lease;
  if (on_lease_since_ms_ == 0) {
    on_lease_since_ms_ = now;
    on_lease_steps_at_start_ = stats_.steps_on_lease - 1;
    CONNEX_LOG_WARN(
        "pp {}: the directory has not renewed epoch {} for {} ms; steps go on under its lease "
        "(for at most {} ms more) while the peers answer",
        name_, epoch, age_ms, *lease_left_ms - stall_ms_);
  }
  return true;
}

}  // namespace connex::pp
