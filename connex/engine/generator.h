// Generation (greedy, or sampled per request) of several prompts as one continuous batch over a
// Pipeline: requests join while others decode, prefills may be chunked, and a request's KV cache
// can be dropped and rebuilt mid-way (recompute) — the reference run that connex-generate prints
// and that the invariance tests compare. Thread-compatible.
#ifndef CONNEX_ENGINE_GENERATOR_H_
#define CONNEX_ENGINE_GENERATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/engine/pipeline.h"

namespace connex::engine {

struct GenerateOptions {
  int64_t max_tokens = 32;    // per request
  int64_t recompute_at = 0;   // > 0: after that many generated tokens, drop and re-prefill
  int64_t max_batch = 0;      // > 0: at most that many requests in a step (the rest wait)
  int64_t prefill_chunk = 0;  // > 0: feed at most that many tokens of a request per step
  bool stop_at_eos = true;    // a generated EOS ends the request (and is kept in `tokens`)
  bool keep_logits = false;   // keep the logits behind every generated token
  // Per prompt (empty: every prompt greedy; otherwise one per prompt, each valid): how its
  // tokens are chosen (pp::Sampling: counter-based, keyed by seed and absolute position).
  std::vector<Sampling> sampling;
};

struct Generation {
  std::vector<int32_t> tokens;             // generated tokens
  std::vector<std::vector<float>> logits;  // when keep_logits: one row per generated token
  int64_t steps = 0;                       // steps the request took part in
  bool recomputed = false;                 // its KV cache was dropped and rebuilt
};

// Generates for every prompt (token ids, BOS included; none empty), in the prompts' order.
// Request ids are `first_request_id + index`. InvalidArgument before any step when a prompt and
// max_tokens would pass the model's max_positions(); errors of the pipeline are returned as they
// are.
absl::StatusOr<std::vector<Generation>> Generate(Pipeline& pipeline,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 const GenerateOptions& options,
                                                 uint64_t first_request_id = 1);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_GENERATOR_H_
