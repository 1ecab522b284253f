// LeaseKeeper: the holder side of a DirectoryClient, written once for every backend. It keeps
// the LIDs this client registered (epoch, credential, addresses), renews their leases through
// the store every heartbeat interval on its own thread, joins again under a new epoch after a
// wrongful eviction, gives a LID up when another epoch took it or it was drained, and says so
// through the registration callbacks. It also vouches for failure reports with the credential
// of a LID it holds in the reported LID's model.
//
// Thread-safe. Registration callbacks run on the thread that found the change (the keeper's, or
// a caller of Renew); they must not block.
#ifndef CONNEX_DIRECTORY_INTERNAL_LEASE_KEEPER_H_
#define CONNEX_DIRECTORY_INTERNAL_LEASE_KEEPER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/clock.h"
#include "connex/base/mutex.h"
#include "connex/directory/client.h"
#include "connex/directory/held_lease.h"
#include "connex/directory/internal/store.h"

namespace connex::directory::internal {

class LeaseKeeper {
 public:
  // `store` and `clock` must outlive the keeper.
  LeaseKeeper(DirectoryStore* store, const DirectoryClientOptions& options, Clock* clock);
  ~LeaseKeeper();  // Stop()s

  // Stops renewing, without leaving: the leases run out as after a crash. The keeper stays
  // usable for the store's threads (OnEpochEnded then renews nothing) until it is destroyed, so
  // that the store can be stopped after it. Idempotent.
  void Stop();

  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // DirectoryClient's contracts (client.h).
  absl::StatusOr<uint64_t> Join(const Lid& lid, std::vector<std::string> addresses,
                                std::map<std::string, std::string> metadata, bool force);
  absl::Status Leave(const Lid& lid);
  absl::Status LeaveAll();
  absl::StatusOr<uint64_t> Renew(const Lid& lid);
  std::optional<uint64_t> EpochOf(const Lid& lid) const;
  std::optional<int64_t> RenewalAgeMs(const Lid& lid) const;
  std::optional<int64_t> LeaseLeftMs(const Lid& lid) const;
  void OnRegistrationChange(std::function<void(const RegistrationChange&)> callback);
  int64_t heartbeat_ms() const { return heartbeat_ms_; }

  // Who reports `lid` failed: `reporter`, vouched for by a LID of the same model this client
  // holds (not `lid` itself), and the admin token if it has one.
  Caller Voucher(const Lid& lid, std::string_view reporter) const;
  // The handle of `lid` (held_lease.h), made on the first call; the same one across Joins.
  std::shared_ptr<const HeldLease> Lease(const Lid& lid);
  // A FAILED or LEFT event ended an epoch: if it is the one held of a LID of ours, its handle
  // says so (an eviction, or an operator's drain: our own LEAVE stopped the renewals first), and
  // the LID is renewed now, so that the refusal starts the rejoin (or the giving up) at once
  // rather than a heartbeat interval later.
  void OnEpochEnded(const Event& event);

 private:
  struct Registration {
    uint64_t epoch = 0;
    std::string credential;  // of `epoch`; never leaves this client except to the directory
    std::vector<std::string> addresses;
    std::map<std::string, std::string> metadata;
    int64_t next_renewal_ms = 0;
    bool renewing = false;   // a scheduled renewal is in flight
    bool rejoining = false;  // a rejoin's JOIN is in flight: no second one
    int64_t renewed_ms = 0;  // when the directory last confirmed `epoch` (JOIN or renewal)
    std::shared_ptr<HeldLease> lease;  // what the holder reads
  };

  void Run();
  // Applies a renewal's outcome; `scheduled`: the keeper's own (which held the next back).
  void OnRenewal(const Held& held, const absl::StatusOr<Renewal>& result, bool scheduled);
  void Rejoin(const Lid& lid, uint64_t old_epoch);
  void Notify(const RegistrationChange& change);
  std::shared_ptr<HeldLease> LeaseLocked(const Lid& lid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();
  int64_t RenewTimeoutMs() const;

  DirectoryStore* const store_;
  const DirectoryClientOptions options_;
  Clock* const clock_;
  int64_t heartbeat_ms_ = 1000;

  mutable Mutex mu_;
  std::map<Lid, Registration> registrations_ ABSL_GUARDED_BY(mu_);
  // Every LID's handle, held or not (a holder may ask before its Join, and keeps it after).
  std::map<Lid, std::shared_ptr<HeldLease>> leases_ ABSL_GUARDED_BY(mu_);
  // Join calls (a migration) in flight per LID: while one is, a refused renewal or a failed
  // rejoin does not give the LID up — the Join's own outcome decides.
  std::map<Lid, int> joins_in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(const RegistrationChange&)>> callbacks_ ABSL_GUARDED_BY(mu_);

  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool stop_ = false;      // guarded by wake_mu_
  bool wake_now_ = false;  // guarded by wake_mu_
  std::thread thread_;
};

}  // namespace connex::directory::internal

#endif  // CONNEX_DIRECTORY_INTERNAL_LEASE_KEEPER_H_
