// RequestOwner: stage 0's requests and their steps — the owner's state machine of the step
// protocol (docs/design/step-protocol.md, "Failure handling (the owner)"). A request is
// submitted, waits for a route, has at most one step in flight, takes its tokens back from the
// last stage's RESULT (streamed one by one), and ends exactly once: completed, or with the error
// that ended it (its deadline, CONNEX_PP_ATTEMPT_MAX sends of a step, CONNEX_PP_REPREFILL_MAX
// re-prefills, no route for CONNEX_PP_ROUTE_WAIT_MS, a permanent hop error, an engine error, a
// cancel). A step is re-sent along a refreshed route when a hop of it fails (peer death, a
// directory FAILED, HOP_FAILED, a step timeout followed by an unanswered probe); a stage that
// answers MISSING makes its request re-prefill from position 0.
//
// It does no I/O of its own: what it needs of its node (the epoch, admission, routes, sending)
// goes through OwnerHost, and it calls the stage-0 engine directly. StageNode's loop drives it.
// Thread-compatible: owned by a StageNode's loop thread; the callbacks (done, on_token) run on
// that thread, inside the call that decided them, and may call Finish.
#ifndef CONNEX_PP_REQUEST_OWNER_H_
#define CONNEX_PP_REQUEST_OWNER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/clock.h"
#include "connex/base/lid.h"
#include "connex/pp/engine.h"
#include "connex/pp/messages.h"
#include "connex/pp/pd.h"
#include "connex/pp/step_sender.h"
#include "connex/pp/tensor_dict.h"

namespace connex::pp {

// What the owner asks of its node. Called on the node's loop thread, from inside the owner's
// calls.
class OwnerHost {
 public:
  virtual ~OwnerHost() = default;
  // This incarnation as a hop: its LID, the epoch it holds now, its signal and transport
  // addresses.
  virtual Hop Self() const = 0;
  // The epoch held, if a step of the owner's own engine may run under it now (EpochGuard); else
  // why not (the step waits for the next round).
  virtual absl::StatusOr<uint64_t> Admit() = 0;
  // Stage 0's engine ran a step under `epoch`, admitted at `admitted_ns` (CLOCK_MONOTONIC).
  virtual void Executed(uint64_t epoch, int64_t admitted_ns) = 0;

  // Routes through stages 1..N-1 (RouteTable).
  // Whether (lid, epoch) is a live member of its stage now.
  virtual bool Usable(const Lid& lid, uint64_t epoch) const = 0;
  // A sticky route that keeps the live hops of `current`; nullopt when a stage has no live
  // replica.
  virtual std::optional<std::vector<Hop>> BuildRoute(const std::vector<Hop>& current) const = 0;
  // Why no route can be built (for error messages).
  virtual std::string RouteProblem() const = 0;
  // Prefill-decode (RequestOwnerOptions::pd): a hop of pool `group` (RouteTable::PdHop: `current`
  // while live, a dead decode hop's standby, else the least loaded by `load`).
  virtual std::optional<Hop> PdHop(uint32_t group, const Hop* current,
                                   const std::map<Lid, size_t>& load) const {
    (void)group, (void)current, (void)load;
    return std::nullopt;
  }
  // Evicts (lid, epoch) (it did not answer a probe); comes back through PeerGone.
  virtual void MarkFailed(const Lid& lid, uint64_t epoch) = 0;

  // Sending (StepSender, the signal transport).
  // Bytes of payload one ring slot holds.
  virtual uint64_t payload_capacity() const = 0;
  // Sends a step to its route's first hop (or queues it for a slot). A send that fails comes
  // back as OnHopFailed.
  virtual void Forward(PendingSend send) = 0;
  virtual void Send(const std::string& address, const Signal& signal) = 0;

  // Request `id` ended: its state is released on the stages it visited (LID -> the signal
  // address last seen).
  virtual void Release(uint64_t id, const std::map<Lid, std::string>& visited) = 0;
  // Called right before a request's outcome is delivered, so that what led to it is visible in
  // the node's stats when the caller hears of it.
  virtual void PublishStats() = 0;
};

struct RequestOwnerOptions {
  Lid self;  // the owner's LID (stage 0)
  uint32_t stages = 1;
  int inflight = 4;                     // steps in flight per route
  int64_t step_timeout_ms = 5000;       // then probe the route
  int64_t probe_timeout_ms = 500;       // a hop that does not answer a probe this long is dead
  int reprefill_max = 8;                // re-prefills before a request is aborted
  int64_t route_wait_ms = 5000;         // no route this long ends a request
  int max_batch = 16;                   // requests per step
  int32_t eos_token = -1;               // generation stops at this token (-1: none)
  int64_t request_timeout_ms = 300000;  // 0: no bound
  int attempt_max = 32;                 // sends of one step before its requests end
  uint64_t owner_token = 1;             // this incarnation's token (in every step)
  uint64_t first_step = 1;              // step ids count up from here
  uint64_t seed = 1;                    // tickets and probe nonces
  Clock* clock = nullptr;               // nullptr: the real clock
  // Prefill-decode disaggregation (pd.h; stages = 2): a request's prompt goes to a prefill
  // instance that hands its state to a decode instance, which generates.
  bool pd = false;
};

// What ends a request besides max_new (SubmitOptions): the owner's EOS unless `ignore_eos`, and
// any of `token_ids`. The token that ends it is kept, the last of its tokens.
struct StopTokens {
  bool ignore_eos = false;
  std::vector<int32_t> token_ids;
  bool Stops(int32_t token, int32_t eos) const {
    return (token == eos && !ignore_eos) ||
           std::find(token_ids.begin(), token_ids.end(), token) != token_ids.end();
  }
};

struct RequestOwnerStats {
  uint64_t late_dropped = 0;  // answers of superseded attempts
  uint64_t resends = 0;       // steps re-sent
  uint64_t failovers = 0;     // requests moved to another replica
  uint64_t reprefills = 0;    // requests recomputed from position 0
  // Requests a standby took over short of their step (KV standby): recomputed from the
  // position it held, not from 0.
  uint64_t lag_recomputes = 0;
  uint64_t aborted = 0;         // requests that ended with an error
  uint64_t completed = 0;       // requests finished
  uint64_t chunked = 0;         // steps that carried only part of a request's tokens
  uint64_t forged_dropped = 0;  // answers not from the hop they claim
  uint64_t steps_executed = 0;  // stage 0's own engine steps
  // PD: prefills that handed a request over to a decode instance, and requests a decode
  // instance lost that resumed from the copy their prefill instance retained (no re-prefill).
  uint64_t pd_handoffs = 0;
  uint64_t pd_retained_resumes = 0;
};

class RequestOwner {
 public:
  // Generated tokens (without the prompt), or the error that ended the request.
  using Completion = std::function<void(uint64_t request_id, absl::StatusOr<std::vector<int32_t>>)>;
  using TokenCallback = std::function<void(uint64_t request_id, int32_t token)>;

  // `engine` (stage 0's) and `host` must outlive the owner.
  RequestOwner(RequestOwnerOptions options, Engine& engine, OwnerHost& host);

  RequestOwner(const RequestOwner&) = delete;
  RequestOwner& operator=(const RequestOwner&) = delete;

  // A new request (the node validated the prompt, max_new and sampling). `timeout_ms` 0: the
  // options' request_timeout_ms. InvalidArgument when `id` is running already.
  absl::Status Add(uint64_t id, std::vector<int32_t> prompt, int max_new, Completion done,
                   TokenCallback on_token, Sampling sampling, int64_t timeout_ms,
                   StopTokens stop = {});
  bool Running(uint64_t id) const { return requests_.count(id) > 0; }
  // Ends request `id` with `status` (OK: completed with the tokens it has): `done` runs, its step
  // stops waiting for it, its state is released. Nothing happens if it is not running.
  void Finish(uint64_t id, absl::Status status);
  // Finishes every running request with `status`; returns how many there were.
  size_t FinishAll(const absl::Status& status);
  // The node stops: every request's `done` runs with `status`, nothing is released (the
  // stages see the owner go).
  void DropAll(const absl::Status& status);

  // Cuts the requests ready for a step into steps on their routes (continuous batching), runs
  // stage 0 of each and sends it.
  void Schedule(int64_t now_ms);
  // Request deadlines, step timeouts and their probes, re-sends that are due.
  void RunTimers(int64_t now_ms);
  // The earliest of `next_ms` and the owner's own timers.
  int64_t NextTimer(int64_t next_ms) const;
  // (lid, epoch) failed: every step routed through it is re-sent.
  void PeerGone(const Lid& lid, uint64_t epoch, const std::string& why);

  // Answers about steps. Each is believed only from a hop of the step's current attempt (the
  // last hop, for a RESULT) with its ticket; a superseded attempt's answer is dropped.
  void OnResult(const ResultSignal& result);
  void OnMissing(const MissingSignal& missing);
  void OnStepError(const StepErrorSignal& error);
  void OnHopFailed(const HopFailedSignal& failed);
  void OnPong(const PongSignal& pong);

  size_t requests() const { return requests_.size(); }
  size_t steps() const { return steps_.size(); }
  // The last step id handed out (RELEASE covers steps up to it).
  uint64_t last_step() const { return next_step_ - 1; }
  // How long no RESULT came back while requests were running (0 when none are).
  int64_t stalled_ms(int64_t now_ms) const {
    return requests_.empty() ? 0 : now_ms - last_progress_ms_;
  }
  const RequestOwnerStats& stats() const { return stats_; }
  // PD: requests whose next (or running) step is a prefill, and those decoding; (0, 0) unless
  // RequestOwnerOptions::pd.
  std::pair<size_t, size_t> PdPhases() const {
    size_t prefill = 0, decode = 0;
    if (!o_.pd) return {0, 0};
    for (const auto& [id, q] : requests_) ++(PdPrefill(q) ? prefill : decode);
    return {prefill, decode};
  }

 private:
  struct Request {
    std::vector<int32_t> tokens;  // prompt, then generated
    size_t prompt_len = 0;
    int max_new = 0;
    size_t cached = 0;   // positions the route holds
    size_t sent_to = 0;  // the in-flight step covers tokens [cached, sent_to)
    std::vector<Hop> route;
    // Stages that may hold its state, released at the end, with the signal address last seen.
    std::map<Lid, std::string> visited;
    uint64_t step = 0;   // in flight; 0 none
    int reprefills = 0;  // failovers that recomputed it (from 0, or from a standby's position)
    // The next step cuts every stage's state back to `cached` (a standby held less than the
    // route: what it lacks is recomputed).
    bool rewind = false;
    int64_t waiting_since = 0;  // for a route
    int64_t deadline = 0;       // 0: none
    int64_t timeout_ms = 0;
    Completion done;
    TokenCallback on_token;
    Sampling sampling;
    StopTokens stop;
    // PD: the decode instance its state goes (went) to; the prefill instance that retains its
    // state for positions [0, retained_positions); whether its next step goes there (the decode
    // instance lost it) instead of a re-prefill.
    Hop handoff;
    std::optional<Hop> retained;
    size_t retained_positions = 0;
    bool use_retained = false;
  };
  struct Step {
    uint32_t attempt = 1;
    uint64_t ticket = 0;  // of the current attempt
    std::vector<uint64_t> ids;
    std::set<uint64_t> remaining;
    std::vector<int32_t> starts, counts;
    std::vector<uint64_t> rewind;  // requests whose stages cut their state back to the start
    std::vector<Hop> route;
    TensorDict output;  // stage 0's, kept to re-send
    int64_t deadline = 0;
    int64_t probe_until = 0;  // probing when > 0
    std::set<Lid> ponged;
    std::vector<uint64_t> pings;  // nonces of the probe in progress
    int64_t resend_at = 0;        // a re-send waits for a slot, a route or a backoff when > 0
    std::string last_problem;     // why it was last re-sent
    bool sent = false;
    Hop handoff;  // PD: a prefill step's decode instance (an empty LID: none)
  };

  int64_t NowMs() const { return clock_->NowMs(); }
  // The running request `id`, which the caller knows is running.
  Request& Get(uint64_t id);
  bool Believe(const Step& st, const Lid& from, uint64_t from_epoch, uint64_t ticket,
               bool last_only) const;
  void EraseStepIfDone(uint64_t step_id);
  void Resend(uint64_t step_id, const std::string& why);
  void CheckRouteWait(Step& st);
  void SendStep(uint64_t step_id, Step& st);
  uint64_t MaxStepTokens() const;
  bool CreateStep(const std::vector<uint64_t>& ids, const std::vector<uint64_t>& ends,
                  const std::vector<Hop>& route, const Hop& handoff);
  // PD: whether the request's next step is a prefill (goes to the prefill pool).
  static bool PdPrefill(const Request& q) {
    return q.use_retained || q.cached == 0 || q.tokens.size() == q.prompt_len;
  }
  // PD: the request's hop for its next step (and, for a prefill, its decode instance), picked
  // by `load` (updated); false while its pool has no live member.
  bool PdRoute(Request& q, std::map<Lid, size_t>& load);

  const RequestOwnerOptions o_;
  const std::string name_;  // the LID, for log lines
  Clock* const clock_;
  Engine& engine_;
  OwnerHost& host_;
  std::mt19937_64 rng_;
  uint64_t next_step_;
  int64_t last_progress_ms_ = 0;  // the last RESULT, or when work began after none
  uint64_t measured_bytes_per_token_ = 0;
  std::map<uint64_t, Request> requests_;
  std::map<uint64_t, Step> steps_;
  std::map<uint64_t, std::pair<uint64_t, Lid>> pings_;  // nonce -> (step, the hop pinged)
  RequestOwnerStats stats_;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_REQUEST_OWNER_H_
