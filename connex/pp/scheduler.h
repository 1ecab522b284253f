// The owner's batching rules, as pure functions so that each is tested alone: how many tokens a
// step may carry (its output must fit a ring slot), and how one route's ready requests are cut
// into steps — up to max_batch requests and max_tokens tokens a step, in arrival order, a
// request with more tokens than fit (a long prompt, a re-prefill) sending a chunk now and the
// rest in a later step (chunked prefill), at most K steps of a route in flight. StageNode's
// loop owns the requests, groups the ready ones by route (RouteTable) and calls these.
// Thread-compatible.
#ifndef CONNEX_PP_SCHEDULER_H_
#define CONNEX_PP_SCHEDULER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "connex/pp/engine.h"
#include "connex/pp/tensor_dict.h"

namespace connex::pp {

// A request ready for a step: it has `total` tokens, of which stage 0 holds the first `cached`
// (the next step carries tokens [cached, total)).
struct ReadyRequest {
  uint64_t id = 0;
  uint64_t cached = 0;
  uint64_t total = 0;
};

// One step to create: request ids[i] covers tokens [its cached, ends[i]).
struct PlannedStep {
  std::vector<uint64_t> ids;
  std::vector<uint64_t> ends;
  size_t chunked = 0;  // requests of this step that send only a chunk of what they have
};

struct StepLimits {
  size_t max_batch = 1;     // requests per step (>= 1)
  uint64_t max_tokens = 1;  // tokens per step (>= 1): what fits a ring slot
  size_t max_steps = 1;     // steps to plan now (the route's free in-flight places)
};

// Cuts `ready` (in this order) into at most `limits.max_steps` steps. Requests that do not get
// into one wait for the next round.
std::vector<PlannedStep> PlanSteps(const std::vector<ReadyRequest>& ready,
                                   const StepLimits& limits);

// Tokens a step may carry so that its output fits a slot of `payload_capacity` bytes with
// `overhead` bytes for the fixed part: capacity over the larger of the engine's per-token figure
// and the one measured on earlier steps; at least 1. Unbounded (UINT64_MAX) when neither is
// known or the pipeline has a single stage (nothing is sent).
uint64_t MaxStepTokens(uint64_t engine_bytes_per_token, uint64_t measured_bytes_per_token,
                       uint64_t payload_capacity, uint64_t overhead, uint32_t stages);

// Stage 0's input of a step: the batch keys (request ids[i] covers `counts[i]` tokens from
// `starts[i]`), the tokens of all of them in that order, and the sampling keys (one per request,
// AddSamplingKeys) when some request does not take the plain argmax — greedy steps carry none —
// with sampling.history when one has a repetition penalty.
TensorDict StepInput(const std::vector<uint64_t>& ids, const std::vector<int32_t>& starts,
                     const std::vector<int32_t>& counts, const std::vector<int32_t>& tokens,
                     const std::vector<Sampling>& sampling);

// Bytes per token of the output of a step that carried `tokens` tokens: the rows of its tensors
// that have one row per token (the batch keys and other per-request tensors are the fixed part
// a chunk's budget already leaves room for). 0 for a step of no tokens.
uint64_t MeasuredBytesPerToken(const TensorDict& out, size_t tokens);

}  // namespace connex::pp

#endif  // CONNEX_PP_SCHEDULER_H_
