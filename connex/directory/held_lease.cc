#include "connex/directory/held_lease.h"

#include <utility>

namespace connex::directory {

std::string HeldLease::eviction() const {
  MutexLock lock(&mu_);
  return eviction_;
}

absl::Status HeldLease::lost() const {
  MutexLock lock(&mu_);
  return lost_;
}

void HeldLease::Advance(uint64_t epoch, bool fresh) {
  MutexLock lock(&mu_);
  uint64_t current = epoch_.load();
  if (epoch < current) return;  // a stale notice: a newer JOIN came first
  epoch_.store(epoch);
  if (fresh || held_.load()) {
    held_.store(true);
    lost_ = absl::OkStatus();
    ended_by_leave_.store(false);
  }
}

void HeldLease::Evict(uint64_t epoch, std::string why) {
  MutexLock lock(&mu_);
  if (epoch == 0 || epoch != epoch_.load() || evicted_.load() == epoch) return;
  eviction_ = std::move(why);
  evicted_.store(epoch);
}

void HeldLease::Drain(uint64_t epoch) {
  if (epoch != 0 && epoch == epoch_.load()) drained_.store(epoch);
}

void HeldLease::Lose(absl::Status why, bool ended_by_leave) {
  MutexLock lock(&mu_);
  if (ended_by_leave) ended_by_leave_.store(true);
  held_.store(false);
  lost_ = std::move(why);
}

}  // namespace connex::directory
