// DrainState: how a StageNode stops taking work and when it is done
// (docs/design/step-protocol.md, "Drain"): its own graceful Stop (it LEAVEs, then finishes what
// is in flight), an operator's drain (a LEFT of its epoch it did not ask for: `connexctl drain`;
// the owner's unfinished requests then hand over as Unavailable and OnDrained runs), or its LID
// lost (another process took it, or the directory gave it up: every step is fenced and every
// request ends). No I/O: the node's loop tells it each turn what it saw, and it ends the node's
// requests through a callback.
// Thread-compatible (the node's loop), except health() and OnDrained (any thread).
#ifndef CONNEX_PP_DRAIN_STATE_H_
#define CONNEX_PP_DRAIN_STATE_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "connex/base/mutex.h"
#include "connex/pp/internal/registration.h"

namespace connex::pp {

class DrainState {
 public:
  // Ends every request the node owns with `why`; returns how many there were.
  using EndRequests = std::function<size_t(const absl::Status& why)>;

  // `name` labels the log lines and errors (the LID); `registration` must outlive it.
  // `requests` counts the node's requests now (for the log).
  DrainState(std::string name, internal::Registration* registration, EndRequests end_requests,
             std::function<size_t()> requests);

  // The node's own Stop(leave): no new work from now on; `drained` is set once nothing of the
  // node's is in flight (AfterTurn) or the node stops (Stopped), whichever comes first.
  void BeginLeave(std::shared_ptr<std::promise<void>> drained);
  // Before a turn's items. A LID lost, not by a LEAVE: every epoch is fenced and the requests end
  // with the registration's error, once (said at ERROR). A LID lost by a LEAVE (the heartbeat
  // found the epoch gone before the LEFT event came), or a LEFT of our epoch we did not ask for:
  // an operator's drain begins — no new work.
  void BeforeTurn();
  // After a turn: `idle` when nothing of the node's is in flight and no step arrived for a short
  // while. A Stop(leave) waiting is let go; an operator's drain ends: the requests hand over
  // (Unavailable: connex-proxy resumes them on another replica) and OnDrained's callback runs.
  void AfterTurn(bool idle);
  // The node stopped: a Stop(leave) still waiting is let go.
  void Stopped();

  // Whether the node takes new work (a Submit, a step of its own requests).
  bool draining() const { return draining_; }
  bool lost() const { return lost_; }
  // OK while the node serves; Unavailable while it drains; the registration's error once it lost
  // its LID. Any thread.
  absl::Status health() const;
  // The registration's error (OK while it holds its LID). Any thread.
  absl::Status lost_status() const;
  // Runs `callback` once an operator's drain is over (on the loop). Any thread.
  void OnDrained(std::function<void()> callback);

 private:
  void StartOperatorDrain();
  void FinishOperatorDrain();

  const std::string name_;
  internal::Registration* const reg_;
  EndRequests end_requests_;
  std::function<size_t()> requests_;
  bool draining_ = false;
  std::atomic<bool> draining_flag_{false};  // draining_, for health() from any thread
  bool operator_draining_ = false;          // an operator's drain began
  bool operator_drained_ = false;           // ... and ended
  bool lost_ = false;
  std::shared_ptr<std::promise<void>> drained_;  // Stop(leave)'s gate
  mutable connex::Mutex drained_mu_;
  std::function<void()> on_drained_ ABSL_GUARDED_BY(drained_mu_);
};

}  // namespace connex::pp

#endif  // CONNEX_PP_DRAIN_STATE_H_
