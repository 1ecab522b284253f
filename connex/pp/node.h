// StageNode: one pipeline stage endpoint of the step protocol. Every stage receives step signals,
// checks the target epoch (fencing), drops duplicates, pulls the payload with one one-sided read,
// acknowledges (freeing the sender's ring slot), runs its engine at most once per step and hands
// the output to the next stage of the step's route, or returns the sampled tokens to the owner.
//
// Stage 0 is also the *owner* of the requests submitted to it: it schedules steps (continuous
// batching, up to `inflight` steps in flight per route), chooses each request's route through
// the other stages from the directory (its own replica chain first), tracks every step until
// its result returns, and fails over: when a stage on a route dies (transport peer-death event,
// directory FAILED, or a step timeout followed by a probe), its in-flight steps are re-sent to
// the same stage of another replica; a stage that does not hold a request's state answers
// *missing* and the owner re-prefills the request along the new route; after `reprefill_max`
// failovers a request is aborted. docs/design/step-protocol.md is the long form.
//
// Thread-safe. One loop thread owns all protocol state and calls the engine; completion
// callbacks run on it and must not block.
#ifndef CONNEX_PP_NODE_H_
#define CONNEX_PP_NODE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/clock.h"
#include "connex/base/lid.h"
#include "connex/directory/client.h"
#include "connex/pp/engine.h"
#include "connex/pp/epoch_ledger.h"
#include "connex/pp/pd.h"
#include "connex/pp/signal_transport.h"
#include "connex/transport/transfer_engine.h"

namespace connex::pp {

struct StageNodeOptions {
  std::string model;
  uint32_t stage = 0;
  uint32_t stages = 1;
  uint32_t replica = 0;
  // Published with the node's record (e.g. stage 0's {"http": "HOST:PORT"}, which the resume
  // proxy and connexctl read); kept across migrations.
  std::map<std::string, std::string> metadata;
  int inflight = 4;                // CONNEX_PP_INFLIGHT: steps in flight per route (owner)
  int64_t step_timeout_ms = 5000;  // CONNEX_PP_STEP_TIMEOUT_MS: then probe the route
  int64_t probe_timeout_ms = 500;  // CONNEX_PP_PROBE_TIMEOUT_MS: no answer = dead
  int reprefill_max = 8;           // CONNEX_PP_REPREFILL_MAX: failovers before an abort
  int64_t route_wait_ms = 5000;    // CONNEX_PP_ROUTE_WAIT_MS: no live replica that long = abort
  int ring_slots = 16;             // CONNEX_PP_RING_SLOTS
  int64_t slot_bytes = 8 << 20;    // CONNEX_PP_SLOT_BYTES
  int max_batch = 16;              // CONNEX_PP_MAX_BATCH: requests per step
  int32_t eos_token = -1;          // generation stops at this token (-1: none)
  // CONNEX_PP_REQUEST_TIMEOUT_MS: a request not finished this long after Submit ends with
  // DeadlineExceeded (0: no bound). SubmitOptions::timeout_ms overrides it per request.
  int64_t request_timeout_ms = 300000;
  int attempt_max = 32;  // CONNEX_PP_ATTEMPT_MAX: sends of one step before its requests abort
  // CONNEX_PP_REPLAY_CACHE_BYTES: outputs kept to answer re-sent attempts without re-running.
  int64_t replay_cache_bytes = int64_t{64} << 20;
  // CONNEX_PP_OWNER_GRACE_MS: how long a stage keeps the requests of an owner that LEFT (it is
  // draining) before it drops them; an owner that FAILED loses them at once.
  int64_t owner_grace_ms = 10000;
  // CONNEX_PP_STALL_CONFIRM_MS: after the node made no progress this long (the process was
  // frozen, starved, or ran one long step), it confirms its epoch with the directory (a heartbeat
  // outside the schedule) before it runs another step, and refuses the step if the directory
  // evicted it meanwhile. 0: half of min(probe_timeout_ms, the directory's lease TTL), below the
  // time peers need to declare it dead.
  int64_t stall_confirm_ms = 0;
  // CONNEX_PP_KV_STANDBY: every later stage mirrors the state its engine appends to its standby
  // (the live replica of its stage after its own), which takes its steps over without a
  // re-prefill when it dies (docs/design/step-protocol.md, "KV standby"). Needs an engine that
  // exports its state. Off by default.
  bool kv_standby = false;
  // CONNEX_PP_KV_STANDBY_BYTES: the mirrors a standby keeps, in bytes; past it the oldest go
  // (their requests are re-prefilled if their primary dies).
  int64_t kv_standby_bytes = int64_t{256} << 20;
  // CONNEX_PP_KV_STANDBY_GRACE_MS: how long a standby keeps the mirrors of a primary that failed
  // for the owners' re-sent steps (those it takes over go at once), and a mirror that no update
  // came for (its primary dropped the request and the MIRROR_DROP was lost, or stopped
  // mirroring it).
  int64_t kv_standby_grace_ms = 10000;
  // CONNEX_PP_KV_STANDBY_INTERVAL_MS: a stage sends its standby at most one round of mirror
  // updates per interval (0: after every turn of its loop). Longer: less work per token on both
  // sides, a standby further behind (a takeover then recomputes the lag).
  int64_t kv_standby_interval_ms = 25;
  // Prefill-decode disaggregation (pd.h, docs/design/pd.md). CONNEX_PD_ROLE: this node's role in
  // a PD deployment (stages = 2: a frontend is stage 0, a prefill or decode instance stage 1);
  // kNone: a plain pipeline stage. Its LID's group is its role's (PdGroup).
  PdRole pd_role = PdRole::kNone;
  // CONNEX_PD_RETAIN_MS: how long a prefill instance keeps a request's KV after its last step
  // (the retained copy a decode instance that lost the request resumes from without a
  // re-prefill); CONNEX_PD_RETAIN_BYTES: at most this many bytes of it, the oldest go first.
  int64_t pd_retain_ms = 30000;
  int64_t pd_retain_bytes = int64_t{1} << 30;
  // CONNEX_PD_HANDOFF_WAIT_MS: how long a prefill instance holds a step's RESULT back for the
  // decode instance to confirm it holds the KV (then the owner's next step finds it there);
  // past it the RESULT goes anyway and the decode instance recomputes what it lacks.
  int64_t pd_handoff_wait_ms = 2000;
  Clock* clock = nullptr;  // nullptr: the real clock (tests inject a FakeClock)

  // Options with the CONNEX_PP_* variables above applied. InvalidArgument names a bad one.
  static absl::StatusOr<StageNodeOptions> FromEnv(StageNodeOptions defaults);
  // InvalidArgument naming the first setting that cannot work (stage outside the pipeline, ...).
  absl::Status Validate() const;
};

struct StageNodeStats {
  uint64_t steps_executed = 0;  // engine steps run on this stage
  uint64_t steps_replayed = 0;  // re-sent attempts answered from the output cache
  uint64_t duplicates_dropped = 0;
  uint64_t fenced = 0;  // signals refused for a wrong epoch
  uint64_t missing_reported = 0;
  uint64_t late_dropped = 0;    // results of superseded attempts (owner)
  uint64_t resends = 0;         // steps re-sent (owner)
  uint64_t failovers = 0;       // requests moved to another replica (owner)
  uint64_t reprefills = 0;      // requests recomputed (owner)
  uint64_t aborted = 0;         // requests aborted (owner)
  uint64_t completed = 0;       // requests finished (owner)
  uint64_t backpressured = 0;   // sends that waited for a ring slot
  uint64_t forged_dropped = 0;  // answers not from the hop (or owner) they claim: dropped
  // PINGs and RELEASEs whose `from` is no member whose signal address is their `reply_to`:
  // neither answered nor acted on (a stranger could name any address to be answered at).
  uint64_t strangers_ignored = 0;
  uint64_t released = 0;          // requests whose state this stage dropped (RELEASE, owner gone)
  uint64_t chunked = 0;           // owner: steps that carried only part of a request's tokens
  size_t held_requests = 0;       // downstream: requests whose state this stage holds now
  uint64_t replay_bytes = 0;      // bytes of outputs kept to answer re-sent attempts
  size_t releases_pending = 0;    // owner: RELEASEs not acknowledged yet
  size_t ring_in_use = 0;         // slots awaiting acknowledgement now
  size_t requests_in_flight = 0;  // owner: submitted, not finished
  // Owner: how long no step of its requests came back while some were in flight (0 when none
  // are): a chain that cannot make progress, whatever the directory shows.
  int64_t stalled_ms = 0;
  size_t steps_in_flight = 0;  // owner: steps not yet answered, and sends waiting for a slot
  uint64_t epoch = 0;          // the epoch this node holds now (0: none, it lost its LID)
  uint64_t epoch_checks = 0;   // epochs confirmed with the directory after a stall
  // Steps run while the directory did not renew the lease, on the lease and the peers' answers
  // (docs/design/step-protocol.md, "The directory down").
  uint64_t steps_on_lease = 0;
  // The last EpochLedger::kEpochsKept epochs this process held, oldest first: steps executed
  // under each, and the CLOCK_MONOTONIC time of the last one's admission (for checks from
  // outside the process: nothing runs under an epoch after its eviction was seen).
  std::vector<EpochSteps> epochs;

  // KV standby (StageNodeOptions::kv_standby).
  uint64_t lag_recomputes = 0;     // owner: requests a standby took over short of their step
  uint64_t rewound = 0;            // requests cut back to a step's start (such a recompute)
  bool kv_standby = false;         // this stage mirrors and keeps mirrors
  uint64_t kv_mirrored_bytes = 0;  // primary: state bytes sent to the standby
  uint64_t kv_mirror_updates = 0;  // primary: MIRRORs sent
  // Primary: the standby's lag when a step ran, in steps (buckets: LagBucketName).
  std::array<uint64_t, 7> kv_standby_lag{};
  uint64_t kv_standby_changes = 0;  // primary: standbys picked, replaced or lost
  size_t kv_mirrors_held = 0;       // standby: requests mirrored here now
  int64_t kv_mirror_bytes_held = 0;
  uint64_t kv_mirrors_dropped_for_budget = 0;  // standby: oldest first, past the budget
  uint64_t kv_takeovers = 0;         // standby: requests taken over whose step ran at once
  uint64_t kv_takeovers_lagged = 0;  // standby: taken over short of the step (lag recomputed)
  // Prefill-decode (pd.h). Frontend: requests a prefill instance handed to a decode instance,
  // and requests a decode instance lost that resumed from their prefill instance's retained
  // copy. Prefill instance: mirror updates and bytes handed to decode instances, requests
  // retained now (and their bytes), retentions that ran out, RESULTs held for a handoff now,
  // and held RESULTs sent after CONNEX_PD_HANDOFF_WAIT_MS without the handoff confirmed.
  uint64_t pd_handoffs = 0;
  uint64_t pd_retained_resumes = 0;
  uint64_t pd_handoff_updates = 0;
  uint64_t pd_handoff_bytes = 0;
  size_t pd_retained = 0;
  int64_t pd_retained_bytes = 0;
  uint64_t pd_retention_expired = 0;
  size_t pd_results_held = 0;
  uint64_t pd_handoff_waits_expired = 0;
  // Prefill instance: RESULTs released after their handoff, and the time they were held in all
  // (the part of the KV transfer not overlapped with the prefill). Frontend: its requests now
  // in their prefill (waiting for or on a prefill instance) and in their decode.
  // Standby or decode instance: payload bytes of the mirrors it pulled, and the time those
  // one-sided reads took (the transfer's own throughput).
  uint64_t kv_mirror_bytes_received = 0;
  uint64_t kv_mirror_read_us = 0;
  uint64_t pd_handoff_results = 0;
  uint64_t pd_handoff_wait_ms = 0;
  size_t pd_prefilling = 0;
  size_t pd_decoding = 0;
};

// Per-request settings of Submit.
struct SubmitOptions {
  // One generated token, as soon as the owner has it (streaming): runs once per token, in
  // order, before the completion.
  std::function<void(uint64_t request_id, int32_t token)> on_token;
  int64_t timeout_ms = 0;  // 0: StageNodeOptions::request_timeout_ms
  // How the last stage chooses each token (default greedy). The sampling keys travel with every
  // step of the request (engine.h); the draw for a token depends only on (seed, position), so a
  // failover, a re-prefill or a resume elsewhere draws the same tokens.
  Sampling sampling;
  // What ends the request besides max_new_tokens, decided here by the owner from the tokens it
  // accepts (so a failover or a resume changes nothing): the node's EOS unless `ignore_eos`,
  // and any of `stop_token_ids`. The stop token is the last of the tokens, as EOS is.
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
};

class StageNode {
 public:
  // Generated tokens (without the prompt), or the error that ended the request.
  using Completion = std::function<void(uint64_t request_id, absl::StatusOr<std::vector<int32_t>>)>;
  // One generated token, as soon as the owner has it (streaming).
  using TokenCallback = std::function<void(uint64_t request_id, int32_t token)>;

  // Joins the directory as (model, stage, 0, replica) with the transfer engine's and the signal
  // transport's addresses, and starts the loop. `engine` and `directory` must outlive the node.
  static absl::StatusOr<std::unique_ptr<StageNode>> Start(StageNodeOptions options, Engine& engine,
                                                          transport::TransferEnginePtr transfer,
                                                          std::unique_ptr<SignalTransport> signals,
                                                          directory::DirectoryClient& directory);
  ~StageNode();  // Stop(/*leave=*/false)

  StageNode(const StageNode&) = delete;
  StageNode& operator=(const StageNode&) = delete;

  // Owner (stage 0) only. Generates up to `max_new_tokens` tokens after `prompt`. `request_id`
  // must be unique among this owner's running requests (stages scope it by the owner's
  // incarnation, so other owners may use the same ids). `done` runs exactly once, with the
  // tokens or the error that ended the request — every request ends, within its timeout and
  // CONNEX_PP_ATTEMPT_MAX sends of a step. `on_token`, if given, runs once per generated token,
  // in order, before `done` (a failover re-sends steps and may recompute the request's state,
  // but never emits a token twice). A prompt larger than a ring slot is sent in chunks.
  // FailedPrecondition on another stage, after Stop, or once the node lost its LID;
  // Unavailable while draining; InvalidArgument for an empty prompt, a duplicate id or a
  // sampling out of range (named).
  absl::Status Submit(uint64_t request_id, std::vector<int32_t> prompt, int max_new_tokens,
                      Completion done, SubmitOptions options);
  absl::Status Submit(uint64_t request_id, std::vector<int32_t> prompt, int max_new_tokens,
                      Completion done, TokenCallback on_token = nullptr);

  // Owner only. Ends a running request now with `why` (a client that went away: Cancelled; a
  // stop string matched: the caller already has the tokens): `done` runs with it, no further
  // token is streamed, and its state is released on every stage that may hold it. NotFound when
  // it is not running (finished already, or never submitted); FailedPrecondition after Stop.
  // May be called from the node's own callbacks (on_token, done) as well as any other thread.
  absl::Status Cancel(uint64_t request_id, absl::Status why = absl::CancelledError("cancelled"));
  // Cancel without waiting (for callers that must not block, such as an HTTP server's I/O
  // thread): the node's loop ends the request soon; nothing happens if it is not running.
  void CancelLater(uint64_t request_id, absl::Status why = absl::CancelledError("cancelled"));

  // Stops the loop. With `leave`, first drains: the node leaves the directory (LEFT, so owners
  // route no new steps here), an owner schedules no new steps, and in-flight steps finish (up to
  // `drain_timeout_ms`); requests that are still unfinished then end with Cancelled.
  // Without, it stops as a crash would (peers see it through the transport and the lease).
  void Stop(bool leave, int64_t drain_timeout_ms = 10000);

  // Moves this endpoint's signals to a new transport (a new address) under the same LID: the
  // directory sees MIGRATED; the engine's state stays. FailedPrecondition after Stop.
  absl::Status Migrate(std::unique_ptr<SignalTransport> signals);

  const Lid& lid() const;
  uint64_t epoch() const;
  // OK while the node serves; Unavailable while it drains; FailedPrecondition once it lost its
  // LID (another process took it, or the directory gave it up): it then refuses every step and
  // request, and says so in the log at ERROR level.
  absl::Status health() const;
  // Runs `callback` once, on the node's thread, when an operator's drain of this node's LID
  // (`connexctl drain`: a LEFT of its epoch it did not ask for) is over: the node took no new
  // work since, the steps in flight finished, and an owner's unfinished requests ended with
  // Unavailable (a client through connex-proxy continues on another replica). connex-stage then
  // exits 0. It must not block.
  void OnDrained(std::function<void()> callback);
  // Whether the node's loop turned within the last `within_ms` (by the node's clock). The loop
  // turns at least every 20 ms while it runs, through failovers and waits; a stopped process or
  // node, or a loop stuck in a call, does not. Any thread; it does not block.
  bool Turning(int64_t within_ms) const;
  // A snapshot published once per turn of the node's loop, and before a request's outcome is
  // delivered (its callback then sees what led to it): it may lag a signal the node has just
  // sent by that turn (wait for such a counter with a deadline, never read it once).
  StageNodeStats stats() const;

 private:
  class Impl;
  explicit StageNode(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_NODE_H_
