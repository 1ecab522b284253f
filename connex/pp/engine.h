// The engine contract: what an inference engine implements so that the step protocol can run
// one pipeline stage of it. Steps cross stages as TensorDicts; the engine reports which requests'
// state (KV cache) it does not hold, releases finished requests, and recomputes a request when it
// is sent again from position 0 (a re-prefill). Connex itself needs no inference engine.
// docs/design/engine-contract.md is the long form. Engines are thread-compatible: the step
// protocol calls one engine from one thread at a time.
#ifndef CONNEX_PP_ENGINE_H_
#define CONNEX_PP_ENGINE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/pp/tensor_dict.h"

namespace connex::pp {

// Keys of a step's TensorDict. B requests, N = sum of num_tokens.
// In (every stage):  request_ids I64 [B], start_positions I32 [B], num_tokens I32 [B].
// In (first stage):  tokens I32 [N] (each request's new tokens, requests in order).
// In (later stages): whatever the previous stage returned besides the batch keys.
// Out (every stage): the three batch keys, copied.
// Out (last stage):  next_tokens I32 [B]: each request's next token.
inline constexpr char kRequestIds[] = "request_ids";
inline constexpr char kStartPositions[] = "start_positions";
inline constexpr char kNumTokens[] = "num_tokens";
inline constexpr char kTokens[] = "tokens";
inline constexpr char kNextTokens[] = "next_tokens";

class Engine {
 public:
  virtual ~Engine() = default;

  // Runs one step. A request with start_position 0 starts afresh: any state the engine held for
  // it is dropped first (this is how a request is recomputed after a failover). Otherwise the
  // engine must hold exactly start_position positions of the request's state.
  // NotFound: some requests' state is not held (MissingRequests); nothing was modified.
  // InvalidArgument: malformed input, named. On any error nothing is modified.
  virtual absl::StatusOr<TensorDict> ExecuteStep(const TensorDict& in) = 0;

  // The requests of step `in` whose state this engine does not hold at start_position (so
  // ExecuteStep would fail with NotFound). Empty when the step can run.
  virtual std::vector<uint64_t> MissingRequests(const TensorDict& in) const = 0;

  // Whether the engine holds state for `request_id`.
  virtual bool HoldsRequest(uint64_t request_id) const = 0;

  // Drops a finished (or aborted, or moved) request's state. No-op when not held.
  virtual void Release(uint64_t request_id) = 0;

  // How many requests' state the engine holds now (an idle stage: 0; a test's end: 0).
  virtual size_t NumHeldRequests() const = 0;

  // An upper bound of the bytes this stage's output grows by per token of a step (a hidden
  // state row), 0 when unknown. The owner uses stage 0's figure to cut a long prefill into
  // steps that fit a ring slot (later stages' outputs are assumed no larger per token); with 0
  // it learns the figure from the first steps, recomputing a step whose output did not fit.
  virtual uint64_t OutputBytesPerToken() const { return 0; }
};

// Builds the three batch keys of a step.
void SetBatch(TensorDict& dict, const std::vector<uint64_t>& request_ids,
              const std::vector<int32_t>& start_positions, const std::vector<int32_t>& num_tokens);

// The batch keys of `dict`, validated (same length B, non-negative). InvalidArgument names what
// is wrong.
struct Batch {
  std::vector<uint64_t> request_ids;
  std::vector<int32_t> start_positions;
  std::vector<int32_t> num_tokens;
};
absl::StatusOr<Batch> GetBatch(const TensorDict& dict);

}  // namespace connex::pp

#endif  // CONNEX_PP_ENGINE_H_
