// EpochLedger: how many steps a stage executed under each of the last few epochs it held, and
// when the last of them was admitted (CLOCK_MONOTONIC, the same clock in every process of a
// host), so that a tool outside the process can check that nothing ran under an epoch after it
// was evicted. Bounded: the oldest epochs are forgotten. Thread-compatible (a StageNode's loop).
#ifndef CONNEX_PP_EPOCH_LEDGER_H_
#define CONNEX_PP_EPOCH_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace connex::pp {

struct EpochSteps {
  uint64_t epoch = 0;
  uint64_t steps_executed = 0;
  int64_t last_step_monotonic_ns = 0;  // admission of the last step executed under it (0: none)
};

// CLOCK_MONOTONIC now, in nanoseconds.
int64_t MonotonicNowNs();

class EpochLedger {
 public:
  static constexpr size_t kEpochsKept = 8;

  // The node holds `epoch` now (an entry with no steps yet, if new). 0 is ignored.
  void Hold(uint64_t epoch) { (void)Find(epoch); }
  // A step admitted at `admitted_ns` was executed under `epoch`.
  void Executed(uint64_t epoch, int64_t admitted_ns) {
    EpochSteps* e = Find(epoch);
    if (e == nullptr) return;
    ++e->steps_executed;
    if (admitted_ns > e->last_step_monotonic_ns) e->last_step_monotonic_ns = admitted_ns;
  }
  // Oldest epoch first.
  const std::vector<EpochSteps>& epochs() const { return epochs_; }

 private:
  EpochSteps* Find(uint64_t epoch);

  std::vector<EpochSteps> epochs_;  // sorted by epoch, at most kEpochsKept
};

}  // namespace connex::pp

#endif  // CONNEX_PP_EPOCH_LEDGER_H_
