// Rotary position embedding frequencies, with Hugging Face's rope_scaling types. A frequency is a
// function of the model and the position alone — never of the batch, the chunk or the step — so
// that RoPE keeps the engine's results batch- and recompute-invariant (docs/design/engine.md).
// Thread-safe (pure functions).
#ifndef CONNEX_ENGINE_ROPE_H_
#define CONNEX_ENGINE_ROPE_H_

#include <cstdint>
#include <vector>

#include "connex/engine/model_config.h"

namespace connex::engine {

// The head_dim / 2 inverse frequencies that rotate a query or key at `position` (rotate-half
// pairs i and i + head_dim / 2 turn by position × inv_freq[i]), computed in double and rounded
// to float as HF keeps them. None, linear and llama3 scaling do not depend on the position.
// Dynamic NTK scaling does: position p uses the base HF derives for a sequence of
// max(p + 1, max_position_embeddings) tokens, i.e. exactly what HF computes when it decodes
// token p as the last of its sequence — the rule that keeps a request's cached keys valid as it
// grows, whereas HF's own whole-prompt prefill rotates every key of a long prompt with the
// prompt length's base (so its results depend on how a prompt is chunked and batched).
std::vector<float> RopeInverseFrequencies(const ModelConfig& config, int64_t position);

// Whether RopeInverseFrequencies depends on `position` for this model (dynamic scaling).
bool RopeDependsOnPosition(const ModelConfig& config);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_ROPE_H_
