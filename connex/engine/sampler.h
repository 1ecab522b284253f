// Counter-based sampling: the next token of a request from its logits, where the random draw
// for the token at absolute position p (its index in prompt + generated) depends only on
// (seed, p) — a Philox4x32-10 block of counter p under key seed, as in Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3" (SC'11). Nothing carries over from one token to the next,
// so a request recomputed on another replica, or resumed from prompt + tokens so far, draws
// exactly what an undisturbed run drew. Every reduction runs in a fixed order (candidates
// sorted by logit, then id; masses summed in double in that order), so the choice depends on
// the logits' bits alone, not on the batch. Pure functions; thread-safe.
#ifndef CONNEX_ENGINE_SAMPLER_H_
#define CONNEX_ENGINE_SAMPLER_H_

#include <array>
#include <cstdint>
#include <span>

#include "connex/pp/engine.h"

namespace connex::engine {

// Philox4x32-10 of `counter` under `key`.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// The uniform draw in [0, 1) (53 bits) for the token at `position` of a request with `seed`.
double UniformAt(uint64_t seed, uint64_t position);

// The token chosen from `logits` (one row, the vocabulary) for the token at `position`:
// greedy (the first maximum) when `sampling.greedy()`; otherwise softmax(logits / temperature)
// over the top_k most probable tokens, cut to the smallest prefix whose mass reaches top_p, and
// a draw of UniformAt(seed, position) on that prefix. `sampling` must be valid.
int32_t SampleToken(std::span<const float> logits, const pp::Sampling& sampling, uint64_t position);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_SAMPLER_H_
