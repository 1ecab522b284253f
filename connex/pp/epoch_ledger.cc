#include "connex/pp/epoch_ledger.h"

#include <time.h>

#include <algorithm>

namespace connex::pp {

int64_t MonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

EpochSteps* EpochLedger::Find(uint64_t epoch) {
  if (epoch == 0) return nullptr;
  auto it = std::lower_bound(epochs_.begin(), epochs_.end(), epoch,
                             [](const EpochSteps& e, uint64_t v) { return e.epoch < v; });
  if (it != epochs_.end() && it->epoch == epoch) return &*it;
  if (epochs_.size() >= kEpochsKept) {
    if (it == epochs_.begin()) return nullptr;  // older than every epoch kept
    epochs_.erase(epochs_.begin());
    it = std::lower_bound(epochs_.begin(), epochs_.end(), epoch,
                          [](const EpochSteps& e, uint64_t v) { return e.epoch < v; });
  }
  return &*epochs_.insert(it, EpochSteps{epoch, 0, 0});
}

}  // namespace connex::pp
