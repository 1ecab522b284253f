// EpochGuard: whether a StageNode may run a step under the epoch it holds — its self-fencing
// (docs/design/step-protocol.md, "Zombies" and "The directory down"). Three rules:
//  - an epoch the directory evicted (Registration::revoked) is refused;
//  - the stall detector: a gap between two signs of life of the node's loop (NoteAlive) longer
//    than the stall bound, or a lease unrenewed for a heartbeat plus the stall bound while no
//    peer was heard from, leaves the epoch unconfirmed; the next step is admitted only after the
//    directory confirms it (LeaseSource::Renew), refused if it evicted it (the client's lease then
//    shows the epoch evicted), refused and asked again a stall bound later if it does not answer;
//  - on the lease: a lease unrenewed (the directory down, restarting, unreachable) while the
//    peers answer (NotePeer within the stall bound) and the lease cannot have run out (its
//    LeaseLeftMs above the stall bound) admits steps without asking.
// Thread-compatible: the node's loop calls it.
#ifndef CONNEX_PP_EPOCH_GUARD_H_
#define CONNEX_PP_EPOCH_GUARD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/clock.h"
#include "connex/base/lid.h"
#include "connex/pp/internal/registration.h"

namespace connex::directory {
class DirectoryClient;
}  // namespace connex::directory

namespace connex::pp {

// What the guard asks about this node's lease (the directory client, for its LID).
class LeaseSource {
 public:
  virtual ~LeaseSource() = default;
  // Since the directory last confirmed the epoch held (nullopt: none held).
  virtual std::optional<int64_t> RenewalAgeMs() const = 0;
  // At least how long the directory keeps the lease by itself (nullopt: none held).
  virtual std::optional<int64_t> LeaseLeftMs() const = 0;
  virtual int64_t heartbeat_ms() const = 0;
  // Confirms the epoch with the directory now (blocking): the epoch it holds, FailedPrecondition
  // or NotFound when it no longer holds ours, Unavailable / DeadlineExceeded when it does not
  // answer.
  virtual absl::StatusOr<uint64_t> Renew() = 0;
};

// The lease of `lid` as a directory client holds it (a StageNode's own).
class DirectoryLease final : public LeaseSource {
 public:
  // `directory` must outlive it.
  DirectoryLease(directory::DirectoryClient& directory, Lid lid)
      : dir_(directory), lid_(std::move(lid)) {}
  std::optional<int64_t> RenewalAgeMs() const override;
  std::optional<int64_t> LeaseLeftMs() const override;
  int64_t heartbeat_ms() const override;
  absl::StatusOr<uint64_t> Renew() override;

 private:
  directory::DirectoryClient& dir_;
  const Lid lid_;
};

struct EpochGuardStats {
  uint64_t epoch_checks = 0;    // confirmations asked of the directory
  uint64_t steps_on_lease = 0;  // steps admitted on the lease while it was not renewed
};

class EpochGuard {
 public:
  // `name` labels the log lines (the LID). `clock`, `registration` and `lease` must outlive it.
  EpochGuard(std::string name, const Clock* clock, int64_t stall_ms,
             internal::Registration* registration, LeaseSource* lease);

  // A sign of life of the loop (each wake, each item it handles).
  void NoteAlive();
  // A signal from a live member this node deals with arrived (after it was handled).
  void NotePeer() { peer_heard_ms_ = clock_->NowMs(); }
  // Whether a step may run under `epoch` now: OK, FailedPrecondition (evicted: fenced) or
  // Unavailable (the directory cannot confirm it now).
  absl::Status Admit(uint64_t epoch);

  int64_t stall_ms() const { return stall_ms_; }
  const EpochGuardStats& stats() const { return stats_; }

 private:
  bool OnTheLease(uint64_t epoch, int64_t age_ms);

  const std::string name_;
  const Clock* const clock_;
  const int64_t stall_ms_;
  internal::Registration* const reg_;
  LeaseSource* const lease_;
  EpochGuardStats stats_;
  int64_t alive_ms_ = 0;            // the loop's last sign of life
  uint64_t unconfirmed_epoch_ = 0;  // held across a stall, not confirmed since (0: none)
  // The epoch our own confirmation found gone (the client's lease says so too while the LID is
  // held; this holds after it was given up as well), and why.
  uint64_t refused_epoch_ = 0;
  std::string refused_why_;
  int64_t stalled_ms_ = 0;
  int64_t next_confirm_ms_ = 0;    // after an unanswered confirmation
  int64_t peer_heard_ms_ = 0;      // the last signal from a member (0: none yet)
  int64_t on_lease_since_ms_ = 0;  // the first step on the lease of this outage (0: none)
  uint64_t on_lease_steps_at_start_ = 0;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_EPOCH_GUARD_H_
