#include "connex/directory/internal/lease_keeper.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::directory::internal {
namespace {

bool Unreachable(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status);
}

// Whether a refused rejoin ends the registration: another process holds the LID (an exclusive
// JOIN is refused), or this client may not hold it at all. Anything else is retried.
bool GivesUp(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) || absl::IsPermissionDenied(status) ||
         absl::IsInvalidArgument(status);
}

}  // namespace

LeaseKeeper::LeaseKeeper(DirectoryStore* store, const DirectoryClientOptions& options, Clock* clock)
    : store_(store), options_(options), clock_(clock) {
  heartbeat_ms_ =
      options_.heartbeat_ms > 0 ? options_.heartbeat_ms : store_->advised_heartbeat_ms();
  if (heartbeat_ms_ <= 0) heartbeat_ms_ = 1000;
  thread_ = std::thread([this] { Run(); });
}

LeaseKeeper::~LeaseKeeper() { Stop(); }

void LeaseKeeper::Stop() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LeaseKeeper::Wake() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_now_ = true;
  }
  wake_.notify_all();
}

// A renewal lost with a dead connection (a directory restart) must not hold the next ones back
// for a whole request timeout, which may exceed the lease.
int64_t LeaseKeeper::RenewTimeoutMs() const {
  return std::min(options_.request_timeout_ms, std::max<int64_t>(heartbeat_ms_, 50));
}

absl::StatusOr<uint64_t> LeaseKeeper::Join(const Lid& lid, std::vector<std::string> addresses,
                                           std::map<std::string, std::string> metadata,
                                           bool force) {
  CONNEX_RETURN_IF_ERROR(ValidateRegistration(addresses, metadata));
  if (force && options_.admin_token.empty()) {
    return absl::PermissionDeniedError(
        StrCat("a forced JOIN of ", lid.ToString(),
               " needs the admin token (CONNEX_DIRECTORY_ADMIN_TOKEN or _FILE)"));
  }
  {
    MutexLock lock(&mu_);
    ++joins_in_flight_[lid];
  }
  struct JoinDone {
    LeaseKeeper* keeper;
    const Lid& lid;
    ~JoinDone() {
      MutexLock lock(&keeper->mu_);
      if (--keeper->joins_in_flight_[lid] == 0) keeper->joins_in_flight_.erase(lid);
    }
  } join_done{this, lid};
  // A previous holder that died keeps the LID until its lease runs out: wait that long.
  const int64_t give_up_ms =
      clock_->NowMs() +
      (options_.join_waits_for_lease ? store_->lease_ttl_ms() + heartbeat_ms_ : 0);
  while (true) {
    JoinAuth auth;
    {
      MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it != registrations_.end()) auth.credential = it->second.credential;
    }
    auth.force = force;
    if (force) auth.admin_token = options_.admin_token;
    absl::StatusOr<Registry::JoinResult> joined = store_->Join(lid, addresses, metadata, auth);
    const int64_t now = clock_->NowMs();
    if (absl::IsAlreadyExists(joined.status()) && now < give_up_ms) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min<int64_t>(give_up_ms - now, heartbeat_ms_)));
      continue;
    }
    if (!joined.ok()) return joined.status();
    MutexLock lock(&mu_);
    Registration& r = registrations_[lid];
    r.epoch = joined->epoch;
    r.credential = joined->credential;
    r.addresses = std::move(addresses);
    r.metadata = std::move(metadata);
    r.next_renewal_ms = now + heartbeat_ms_;
    r.renewed_ms = now;
    // A renewal (or rejoin) of the previous epoch may still be in flight (a migration); its
    // outcome is ignored as stale, so it must not hold the next renewals back.
    r.renewing = false;
    r.rejoining = false;
    r.lease = LeaseLocked(lid);
    r.lease->Advance(joined->epoch, /*fresh=*/true);
    return joined->epoch;
  }
}

absl::Status LeaseKeeper::Leave(const Lid& lid) {
  Caller caller;
  uint64_t epoch = 0;
  {
    MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end()) {
      return absl::NotFoundError(StrCat("this client does not hold ", lid.ToString()));
    }
    epoch = it->second.epoch;
    caller.credential = it->second.credential;
    registrations_.erase(it);  // stop renewing first
  }
  absl::Status left = store_->Leave(lid, epoch, caller);
  // Gone already (evicted, expired, superseded): nothing is left to leave.
  if (absl::IsNotFound(left) || absl::IsFailedPrecondition(left)) return absl::OkStatus();
  return left;
}

absl::Status LeaseKeeper::LeaveAll() {
  std::vector<Lid> lids;
  {
    MutexLock lock(&mu_);
    for (const auto& [lid, r] : registrations_) lids.push_back(lid);
  }
  absl::Status result;
  for (const Lid& lid : lids) result.Update(Leave(lid));
  return result;
}

absl::StatusOr<uint64_t> LeaseKeeper::Renew(const Lid& lid) {
  Held held;
  {
    MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end()) {
      return absl::NotFoundError(StrCat("this client does not hold ", lid.ToString()));
    }
    held = Held{lid, it->second.epoch, it->second.credential};
  }
  std::vector<absl::StatusOr<Renewal>> renewed = store_->Renew({held}, RenewTimeoutMs());
  CONNEX_CHECK(renewed.size() == 1);
  OnRenewal(held, renewed[0], /*scheduled=*/false);
  if (renewed[0].ok()) return renewed[0]->epoch;
  if (Unreachable(renewed[0].status())) return renewed[0].status();
  return absl::FailedPreconditionError(
      StrCat("directory: ", lid.ToString(), " epoch ", held.epoch,
             " is no longer held: ", renewed[0].status().message()));
}

std::optional<uint64_t> LeaseKeeper::EpochOf(const Lid& lid) const {
  MutexLock lock(&mu_);
  auto it = registrations_.find(lid);
  if (it == registrations_.end()) return std::nullopt;
  return it->second.epoch;
}

std::optional<int64_t> LeaseKeeper::RenewalAgeMs(const Lid& lid) const {
  MutexLock lock(&mu_);
  auto it = registrations_.find(lid);
  if (it == registrations_.end()) return std::nullopt;
  return clock_->NowMs() - it->second.renewed_ms;
}

std::optional<int64_t> LeaseKeeper::LeaseLeftMs(const Lid& lid) const {
  std::optional<int64_t> age = RenewalAgeMs(lid);
  if (!age) return std::nullopt;
  return store_->LeaseLeftMs(*age);
}

void LeaseKeeper::OnRegistrationChange(std::function<void(const RegistrationChange&)> callback) {
  MutexLock lock(&mu_);
  callbacks_.push_back(std::move(callback));
}

Caller LeaseKeeper::Voucher(const Lid& lid, std::string_view reporter) const {
  Caller caller;
  caller.name = std::string(reporter);
  caller.admin_token = options_.admin_token;
  MutexLock lock(&mu_);
  for (const auto& [held, r] : registrations_) {
    if (held.model != lid.model || held == lid) continue;
    caller.member = held;
    caller.member_credential = r.credential;
    break;
  }
  return caller;
}

std::shared_ptr<HeldLease> LeaseKeeper::LeaseLocked(const Lid& lid) {
  std::shared_ptr<HeldLease>& lease = leases_[lid];
  if (!lease) lease = std::make_shared<HeldLease>(lid);
  return lease;
}

std::shared_ptr<const HeldLease> LeaseKeeper::Lease(const Lid& lid) {
  MutexLock lock(&mu_);
  return LeaseLocked(lid);
}

void LeaseKeeper::OnEpochEnded(const Event& event) {
  const Lid& lid = event.record.lid;
  const uint64_t epoch = event.record.epoch;
  {
    MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end() || it->second.epoch != epoch) return;
    Registration& r = it->second;
    if (event.kind == EventKind::kLeft) {
      // Our own LEAVE erased the registration before it was sent: this LEFT is an operator's.
      r.lease->Drain(epoch);
    } else if (event.kind == EventKind::kFailed) {
      r.lease->Evict(epoch, event.reason.empty()
                                ? std::string(EventKindName(event.kind))
                                : StrCat(EventKindName(event.kind), " (", event.reason, ")"));
    } else {
      return;
    }
    if (r.renewing || r.rejoining) return;
    CONNEX_LOG_INFO("directory client: {} epoch {} ended: renewing now", lid.ToString(), epoch);
    r.next_renewal_ms = 0;
  }
  Wake();
}

void LeaseKeeper::Run() {
  while (true) {
    std::vector<Held> due;
    int64_t wait_ms = 100;
    {
      const int64_t now = clock_->NowMs();
      MutexLock lock(&mu_);
      for (auto& [lid, r] : registrations_) {
        if (r.renewing || r.rejoining) continue;
        if (r.next_renewal_ms > now) {
          wait_ms = std::min(wait_ms, r.next_renewal_ms - now);
          continue;
        }
        r.renewing = true;
        r.next_renewal_ms = now + heartbeat_ms_;
        due.push_back(Held{lid, r.epoch, r.credential});
      }
    }
    if (!due.empty()) {
      std::vector<absl::StatusOr<Renewal>> renewed = store_->Renew(due, RenewTimeoutMs());
      CONNEX_CHECK(renewed.size() == due.size());
      for (size_t i = 0; i < due.size(); ++i) OnRenewal(due[i], renewed[i], /*scheduled=*/true);
      wait_ms = 0;
    }
    // Waited for in slices of at most 100 ms, so that the schedule follows the injected clock.
    std::unique_lock<std::mutex> lock(wake_mu_);
    wake_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this] { return stop_ || wake_now_; });
    if (stop_) return;
    wake_now_ = false;
  }
}

void LeaseKeeper::OnRenewal(const Held& held, const absl::StatusOr<Renewal>& result,
                            bool scheduled) {
  const Lid& lid = held.lid;
  bool adopted = false;
  bool rejoin = false;
  uint64_t now_held = held.epoch;
  {
    MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end() || it->second.epoch != held.epoch) return;  // left, migrated
    Registration& r = it->second;
    // The epoch is no longer current, whatever comes of it (a rejoin, giving the LID up) — unless
    // a LEAVE ended it: an operator's drain is no eviction.
    if (!result.ok() && !Unreachable(result.status()) && !EndedByLeave(result.status())) {
      r.lease->Evict(held.epoch, StrCat("renewal refused: ", result.status().message()));
    }
    if (r.rejoining) return;  // the rejoin's JOIN decides (and re-arms the renewals)
    if (scheduled) r.renewing = false;
    if (result.ok()) {
      if (result->epoch == held.epoch) {
        r.renewed_ms = clock_->NowMs();
        return;
      }
      if (result->credential.empty()) return;
      // A JOIN of ours was applied but its reply was lost: the directory knows better.
      r.epoch = now_held = result->epoch;
      r.credential = result->credential;
      r.renewed_ms = clock_->NowMs();
      r.lease->Advance(now_held, /*fresh=*/false);
      adopted = true;
    } else if (Unreachable(result.status()) || joins_in_flight_.count(lid)) {
      return;  // the directory is unreachable, or a Join of ours decides: keep on
    } else if (absl::IsNotFound(result.status()) && options_.rejoin_after_eviction) {
      r.renewing = true;  // no renewals until the JOIN is answered
      r.rejoining = rejoin = true;
    } else {
      r.lease->Lose(absl::IsNotFound(result.status())
                        ? absl::FailedPreconditionError(result.status().message())
                        : result.status(),
                    EndedByLeave(result.status()));
      registrations_.erase(it);
    }
  }
  if (adopted) {
    Notify(RegistrationChange{lid, held.epoch, now_held, absl::OkStatus()});
    return;
  }
  if (rejoin) {
    CONNEX_LOG_WARN("directory client: {} epoch {}: renewal refused ({}); joining again",
                    lid.ToString(), held.epoch, AsStd(result.status().message()));
    Rejoin(lid, held.epoch);
    return;
  }
  CONNEX_LOG_WARN("directory client: {} epoch {}: renewal refused ({}); giving the LID up",
                  lid.ToString(), held.epoch, AsStd(result.status().message()));
  RegistrationChange gone{lid, held.epoch, 0,
                          absl::IsNotFound(result.status())
                              ? absl::FailedPreconditionError(result.status().message())
                              : result.status()};
  gone.left = EndedByLeave(result.status());
  Notify(gone);
}

void LeaseKeeper::Rejoin(const Lid& lid, uint64_t old_epoch) {
  std::vector<std::string> addresses;
  std::map<std::string, std::string> metadata;
  JoinAuth exclusive;
  exclusive.exclusive = true;  // never displace anyone
  {
    MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end() || it->second.epoch != old_epoch) return;
    addresses = it->second.addresses;
    metadata = it->second.metadata;
    exclusive.credential = it->second.credential;
  }
  absl::StatusOr<Registry::JoinResult> joined = store_->Join(lid, addresses, metadata, exclusive);
  {
    MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end() || it->second.epoch != old_epoch) return;
    Registration& r = it->second;
    r.rejoining = false;
    if (joined.ok()) {
      r.epoch = joined->epoch;
      r.credential = joined->credential;
      r.renewing = false;
      r.next_renewal_ms = clock_->NowMs() + heartbeat_ms_;
      r.renewed_ms = clock_->NowMs();
      r.lease->Advance(joined->epoch, /*fresh=*/false);
    } else if (!GivesUp(joined.status()) || joins_in_flight_.count(lid)) {
      // Unreachable, or a passing refusal (on etcd: a JOIN made with the lease that expired
      // under it, before the store noticed): the next renewal tells us again. A Join of ours in
      // flight (a migration) took the LID first, or will report why it could not.
      CONNEX_LOG_WARN("directory client: {} epoch {}: joining again failed ({}); retrying",
                      lid.ToString(), old_epoch, AsStd(joined.status().message()));
      r.renewing = false;
      return;
    } else {
      r.lease->Lose(joined.status(), /*ended_by_leave=*/false);
      registrations_.erase(it);
    }
  }
  if (joined.ok()) {
    CONNEX_LOG_INFO("directory client: {} rejoined: epoch {} -> {}", lid.ToString(), old_epoch,
                    joined->epoch);
    Notify(RegistrationChange{lid, old_epoch, joined->epoch, absl::OkStatus()});
  } else {
    Notify(RegistrationChange{lid, old_epoch, 0, joined.status()});
  }
}

void LeaseKeeper::Notify(const RegistrationChange& change) {
  std::vector<std::function<void(const RegistrationChange&)>> callbacks;
  {
    MutexLock lock(&mu_);
    callbacks = callbacks_;
  }
  for (auto& cb : callbacks) cb(change);
}

}  // namespace connex::directory::internal
