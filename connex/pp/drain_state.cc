#include "connex/pp/drain_state.h"

#include <utility>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::pp {

DrainState::DrainState(std::string name, internal::Registration* registration,
                       EndRequests end_requests, std::function<size_t()> requests)
    : name_(std::move(name)),
      reg_(registration),
      end_requests_(std::move(end_requests)),
      requests_(std::move(requests)) {
  CONNEX_CHECK(reg_ != nullptr && end_requests_ && requests_);
}

void DrainState::BeginLeave(std::shared_ptr<std::promise<void>> drained) {
  draining_ = true;
  draining_flag_.store(true);
  drained_ = std::move(drained);
}

void DrainState::BeforeTurn() {
  // A node that lost its LID refuses everything from then on, and says so once, loudly. After an
  // operator's drain that is expected (the heartbeat finds the epoch gone, possibly before the
  // LEFT event came): the drain goes on.
  if (!lost_) {
    absl::Status health = lost_status();
    if (!health.ok()) {
      if (reg_->operator_drain.load() || reg_->lease->ended_by_leave()) {
        reg_->operator_drain.store(true);
      } else {
        lost_ = true;
        CONNEX_LOG_ERROR("pp {}: {}; this node no longer serves", name_, AsStd(health.message()));
        reg_->Fence();  // every step for any epoch is fenced from now on
        end_requests_(health);
      }
    }
  }
  if (reg_->lease->drained()) reg_->operator_drain.store(true);
  if (reg_->operator_drain.load() && !operator_draining_) StartOperatorDrain();
}

void DrainState::AfterTurn(bool idle) {
  if (!idle) return;
  if (drained_) {
    drained_->set_value();
    drained_.reset();
  }
  if (operator_draining_ && !operator_drained_) FinishOperatorDrain();
}

void DrainState::Stopped() {
  if (drained_) {
    drained_->set_value();
    drained_.reset();
  }
}

// An operator's drain (connexctl drain: a LEFT of our epoch we did not ask for): no new work
// from now on; what is in flight finishes (FinishOperatorDrain).
void DrainState::StartOperatorDrain() {
  operator_draining_ = true;
  draining_ = true;
  draining_flag_.store(true);
  CONNEX_LOG_WARN(
      "pp {}: drained by the operator: no new work; finishing the steps in flight "
      "({} requests owned here)",
      name_, requests_());
}

// Nothing of ours is in flight any more: an owner's requests that did not end hand over (a
// server-side Unavailable, which connex-proxy resumes on another replica); then OnDrained.
void DrainState::FinishOperatorDrain() {
  operator_drained_ = true;
  const size_t handed_over = end_requests_(absl::UnavailableError(
      StrCat("pp: ", name_,
             " was drained by the operator before the request ended; it continues on another "
             "replica")));
  CONNEX_LOG_WARN("pp {}: drained ({} requests handed over)", name_, handed_over);
  std::function<void()> on_drained;
  {
    connex::MutexLock lock(&drained_mu_);
    on_drained = on_drained_;
  }
  if (on_drained) on_drained();
}

absl::Status DrainState::health() const {
  if (draining_flag_.load()) return absl::UnavailableError(StrCat("pp: ", name_, " is draining"));
  return lost_status();
}

absl::Status DrainState::lost_status() const {
  absl::Status lost = reg_->lease->lost();
  if (lost.ok()) return lost;
  return Annotate(lost, StrCat("pp: ", reg_->lease->lid().ToString(), " lost its LID (epoch ",
                               reg_->lease->epoch(), ")"));
}

void DrainState::OnDrained(std::function<void()> callback) {
  connex::MutexLock lock(&drained_mu_);
  on_drained_ = std::move(callback);
}

}  // namespace connex::pp
