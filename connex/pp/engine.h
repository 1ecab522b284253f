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
// Sampling (optional, every stage; a stage that does not sample passes every `sampling.*` key on
// unchanged): sampling.temperature F32 [B], sampling.top_p F32 [B], sampling.top_k I32 [B],
//   sampling.seed I64 [B], and (each optional) sampling.min_p F32 [B],
//   sampling.repetition_penalty F32 [B]. Absent: every request is greedy. See Sampling.
//   sampling.history I32 [N]: the step's tokens again, carried to the last stage when a request
//   of the step has a repetition penalty (the last stage keeps them beside its KV cache).
inline constexpr char kRequestIds[] = "request_ids";
inline constexpr char kStartPositions[] = "start_positions";
inline constexpr char kNumTokens[] = "num_tokens";
inline constexpr char kTokens[] = "tokens";
inline constexpr char kNextTokens[] = "next_tokens";
inline constexpr char kSamplingTemperature[] = "sampling.temperature";
inline constexpr char kSamplingTopP[] = "sampling.top_p";
inline constexpr char kSamplingTopK[] = "sampling.top_k";
inline constexpr char kSamplingSeed[] = "sampling.seed";
inline constexpr char kSamplingMinP[] = "sampling.min_p";
inline constexpr char kSamplingRepetitionPenalty[] = "sampling.repetition_penalty";
inline constexpr char kSamplingHistory[] = "sampling.history";
// The prefix of every sampling key: a stage that does not sample passes these on.
inline constexpr char kSamplingPrefix[] = "sampling.";

// How a request's next token is chosen from its logits. temperature 0 is greedy (the most
// probable token, the lowest id on a tie); otherwise the draw for the token at absolute position
// p (its index in prompt + generated) depends only on (seed, p), so that a request recomputed
// on another replica — after a handover, or resumed with prompt + tokens so far — draws the
// same tokens as an undisturbed run. vLLM's order: the repetition penalty on the logits, then
// temperature, min_p, top_k, top_p, and the draw.
struct Sampling {
  float temperature = 0;  // [0, 2]; 0: greedy
  float top_p = 1;        // (0, 1]: the smallest set of most probable tokens whose mass >= top_p
  int32_t top_k = 0;      // 0: every token; k > 0: the k most probable
  uint64_t seed = 0;
  float min_p = 0;  // [0, 1]: drop the tokens less probable than min_p x the most probable
  // > 0, 1: none. The logit of every token of the prompt or the output so far is divided by it
  // when positive, multiplied when not (vLLM's and Hugging Face's rule); greedy requests too.
  float repetition_penalty = 1;

  bool greedy() const { return temperature == 0 || top_k == 1; }
  bool penalized() const { return repetition_penalty != 1; }
  // Whether the token is the plain argmax of the logits (the step needs no sampling key).
  bool argmax() const { return greedy() && !penalized(); }
  // InvalidArgument naming the field out of range.
  absl::Status Validate() const;
};

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

  // ---- A request's state as data (optional; a KV standby needs it) ----
  // docs/design/engine-contract.md, "State as data". An engine that implements these can hand a
  // request's state to another engine of the same stage of the same model: the importer then
  // produces exactly the outputs the exporter would have. The protocol copies the exported
  // tensors into registered memory (a ring slot) and the other stage pulls them with a
  // one-sided read; the engine owns nothing it exports once ExportState returns.

  // Whether ExportState, ImportState and DropState are implemented (the defaults are not).
  virtual bool ExportsState() const { return false; }
  // Positions of the request's state held now; 0 when none (and always 0 unless ExportsState).
  virtual int64_t HeldPositions(uint64_t /*request_id*/) const { return 0; }
  // The request's state for positions [from, to) (0 <= from < to <= HeldPositions): tensors of
  // the engine's own naming whose first dimension is to - from (one row per position), e.g. a
  // layer's K and V rows. OutOfRange when fewer than `to` positions are held; Unimplemented
  // unless ExportsState.
  virtual absl::StatusOr<TensorDict> ExportState(uint64_t request_id, int64_t from,
                                                 int64_t to) const;
  // Appends `state` (what ExportState of an engine of the same stage and model returned for
  // positions [from, from + rows)) to the request's state. The engine must hold exactly `from`
  // positions of it (from 0: the request starts afresh, whatever was held is dropped).
  // FailedPrecondition when it holds another number; InvalidArgument names a missing or
  // malformed tensor. On error nothing changes. Unimplemented unless ExportsState.
  virtual absl::Status ImportState(uint64_t request_id, int64_t from, const TensorDict& state);
  // Cuts the request's state back to its first `from` positions (0: drops it all, as Release),
  // so that its next step may start at `from`. No-op when it holds no more than that.
  // Unimplemented unless ExportsState (except from 0, which releases).
  virtual absl::Status DropState(uint64_t request_id, int64_t from);
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

// Sets the sampling keys of a step of B = sampling.size() requests (in the batch's order).
void SetSampling(TensorDict& dict, const std::vector<Sampling>& sampling);
// The sampling of each of the `batch_size` requests of `dict`: greedy for all when the keys are
// absent (min_p 0 and repetition_penalty 1 when theirs are). InvalidArgument when some of the
// four others are present and others not, of the wrong type or size, or out of range (named).
absl::StatusOr<std::vector<Sampling>> GetSampling(const TensorDict& dict, int64_t batch_size);

// Stage 0's sampling keys of a step whose batch keys and `tokens` are set: none when every
// request takes the argmax; else SetSampling, plus sampling.history (a copy of `tokens`) when a
// request has a repetition penalty, so that the last stage learns every token it penalizes from
// the steps themselves — a recompute, which re-sends prompt + generated, rebuilds it with the KV
// cache. What the owner (StepInput) and connex-generate both send.
void AddSamplingKeys(TensorDict& dict, const std::vector<Sampling>& sampling);
// sampling.history of `dict`, checked: nullptr when absent; InvalidArgument unless I32 [tokens].
absl::StatusOr<const Tensor*> GetSamplingHistory(const TensorDict& dict, int64_t tokens);

}  // namespace connex::pp

#endif  // CONNEX_PP_ENGINE_H_
