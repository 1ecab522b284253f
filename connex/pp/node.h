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

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/directory/client.h"
#include "connex/pp/engine.h"
#include "connex/pp/signal_transport.h"
#include "connex/transport/transfer_engine.h"

namespace connex::pp {

struct StageNodeOptions {
  std::string model;
  uint32_t stage = 0;
  uint32_t stages = 1;
  uint32_t replica = 0;
  int inflight = 4;                // CONNEX_PP_INFLIGHT: steps in flight per route (owner)
  int64_t step_timeout_ms = 5000;  // CONNEX_PP_STEP_TIMEOUT_MS: then probe the route
  int64_t probe_timeout_ms = 500;  // CONNEX_PP_PROBE_TIMEOUT_MS: no answer = dead
  int reprefill_max = 8;           // CONNEX_PP_REPREFILL_MAX: failovers before an abort
  int64_t route_wait_ms = 30000;   // CONNEX_PP_ROUTE_WAIT_MS: no live replica that long = abort
  int ring_slots = 16;             // CONNEX_PP_RING_SLOTS
  int64_t slot_bytes = 8 << 20;    // CONNEX_PP_SLOT_BYTES
  int max_batch = 16;              // CONNEX_PP_MAX_BATCH: requests per step
  int32_t eos_token = -1;          // generation stops at this token (-1: none)

  // Options with the CONNEX_PP_* variables above applied. InvalidArgument names a bad one.
  static absl::StatusOr<StageNodeOptions> FromEnv(StageNodeOptions defaults);
};

struct StageNodeStats {
  uint64_t steps_executed = 0;  // engine steps run on this stage
  uint64_t steps_replayed = 0;  // re-sent attempts answered from the output cache
  uint64_t duplicates_dropped = 0;
  uint64_t fenced = 0;  // signals refused for a wrong epoch
  uint64_t missing_reported = 0;
  uint64_t late_dropped = 0;      // results of superseded attempts (owner)
  uint64_t resends = 0;           // steps re-sent (owner)
  uint64_t failovers = 0;         // requests moved to another replica (owner)
  uint64_t reprefills = 0;        // requests recomputed (owner)
  uint64_t aborted = 0;           // requests aborted (owner)
  uint64_t completed = 0;         // requests finished (owner)
  uint64_t backpressured = 0;     // sends that waited for a ring slot
  size_t ring_in_use = 0;         // slots awaiting acknowledgement now
  size_t requests_in_flight = 0;  // owner: submitted, not finished
  size_t steps_in_flight = 0;     // owner: steps not yet answered, and sends waiting for a slot
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
  // must be unique among every owner sharing the stages. `done` runs exactly once. `on_token`,
  // if given, runs once per generated token, in order, before `done` (a failover re-sends steps
  // and may recompute the request's state, but never emits a token twice).
  // FailedPrecondition on another stage; InvalidArgument for an empty prompt or a duplicate id.
  absl::Status Submit(uint64_t request_id, std::vector<int32_t> prompt, int max_new_tokens,
                      Completion done, TokenCallback on_token = nullptr);

  // Stops the loop. With `leave`, first drains: the node leaves the directory (LEFT, so owners
  // route no new steps here), an owner schedules no new steps, and in-flight steps finish (up to
  // `drain_timeout_ms`); requests that are still unfinished then end with Cancelled.
  // Without, it stops as a crash would (peers see it through the transport and the lease).
  void Stop(bool leave, int64_t drain_timeout_ms = 10000);

  // Moves this endpoint's signals to a new transport (a new address) under the same LID: the
  // directory sees MIGRATED; the engine's state stays.
  absl::Status Migrate(std::unique_ptr<SignalTransport> signals);

  const Lid& lid() const;
  uint64_t epoch() const;
  StageNodeStats stats() const;

 private:
  class Impl;
  explicit StageNode(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_NODE_H_
