// A StageNode incarnation's registration: its LID's lease as the directory client keeps it
// (directory::HeldLease: the epoch held, an eviction being rejoined from, a loss, an operator's
// drain), and what the node decides itself on top of it — that the LID is lost for good (fenced:
// every step refused from then on) and that it drains for an operator. Shared between the node's
// loop, its EpochGuard, its DrainState and its step receiver's thread.
#ifndef CONNEX_PP_INTERNAL_REGISTRATION_H_
#define CONNEX_PP_INTERNAL_REGISTRATION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "connex/base/check.h"
#include "connex/directory/held_lease.h"

namespace connex::pp::internal {

struct Registration {
  explicit Registration(std::shared_ptr<const directory::HeldLease> held) : lease(std::move(held)) {
    CONNEX_CHECK(lease != nullptr);
  }

  // The epoch steps run under: the lease's, 0 once fenced (and before the Join).
  uint64_t epoch() const { return fenced.load() ? 0 : lease->epoch(); }
  // The LID is lost: no step of any epoch runs here again.
  void Fence() { fenced.store(true); }

  const std::shared_ptr<const directory::HeldLease> lease;
  std::atomic<bool> fenced{false};
  // Latched once an operator's drain shows (the lease's drained(), or its loss by a LEAVE that
  // was not ours); the node then drains.
  std::atomic<bool> operator_drain{false};
};

}  // namespace connex::pp::internal

#endif  // CONNEX_PP_INTERNAL_REGISTRATION_H_
