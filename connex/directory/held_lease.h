// HeldLease: one LID as the DirectoryClient holding it knows it — the epoch held, an eviction
// the client is rejoining from, whether it gave the LID up and why, and an operator's drain of
// it. The client's lease keeper writes it from the renewals it makes and the FAILED / LEFT
// events of the models the client watches; the holder reads it, from any thread, instead of
// deriving those facts again from the events (a pipeline stage asks it whether the epoch a step
// carries is still its own). DirectoryClient::Lease hands it out as shared_ptr<const HeldLease>:
// it outlives the client.
//
// Thread-safe. The writers are the client's (and tests'); holders only read.
#ifndef CONNEX_DIRECTORY_HELD_LEASE_H_
#define CONNEX_DIRECTORY_HELD_LEASE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "connex/base/lid.h"
#include "connex/base/mutex.h"

namespace connex::directory {

class HeldLease {
 public:
  explicit HeldLease(Lid lid) : lid_(std::move(lid)) {}

  HeldLease(const HeldLease&) = delete;
  HeldLease& operator=(const HeldLease&) = delete;

  const Lid& lid() const { return lid_; }

  // The epoch this client holds `lid` under — or held last, once it gave the LID up; 0 before
  // the first Join. Only grows: a rejoin's notice that comes after a migration's newer JOIN does
  // not take it back.
  uint64_t epoch() const { return epoch_.load(); }
  // Whether `lid` is held now: joined, and not given up since.
  bool held() const { return held_.load(); }
  // An epoch of `lid` the directory ended while this client held it (a FAILED event: a failure
  // report, a lease run out, a supersession; or a renewal refused), and why. The client joins
  // again under a new epoch, or gives the LID up. 0 when none was.
  uint64_t evicted_epoch() const { return evicted_.load(); }
  std::string eviction() const;
  // OK while held and before the first Join; once given up, why (FailedPrecondition: another
  // epoch took the LID or a LEAVE ended it; whatever refused the rejoin).
  absl::Status lost() const;
  // The LID was given up because a LEAVE ended its epoch: this client's own, or an operator's
  // drain (`connexctl drain`) whose LEFT event had not come yet.
  bool ended_by_leave() const { return ended_by_leave_.load(); }
  // A LEFT of the epoch held that this client did not ask for: an operator drained the LID. The
  // holder finishes what it has and stops taking work; it is no eviction.
  bool drained() const {
    const uint64_t d = drained_.load();
    return d != 0 && d == epoch_.load();
  }

  // ---- written by the client that holds the LID ----
  // Joined (or rejoined, or a JOIN of ours whose reply was lost came to light) under `epoch`.
  // `fresh`: a Join of the holder's (not the client's own rejoin), which clears a loss.
  void Advance(uint64_t epoch, bool fresh);
  // The directory ended `epoch`; ignored unless it is the epoch held.
  void Evict(uint64_t epoch, std::string why);
  // A LEFT of `epoch` not asked for by this client; ignored unless it is the epoch held.
  void Drain(uint64_t epoch);
  // The client gave the LID up.
  void Lose(absl::Status why, bool ended_by_leave);

 private:
  const Lid lid_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<bool> held_{false};
  std::atomic<uint64_t> evicted_{0};
  std::atomic<uint64_t> drained_{0};
  std::atomic<bool> ended_by_leave_{false};
  mutable Mutex mu_;
  std::string eviction_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
};

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_HELD_LEASE_H_
