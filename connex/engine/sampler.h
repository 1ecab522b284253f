// Counter-based sampling: the next token of a request from its logits, where the random draw
// for the token at absolute position p (its index in prompt + generated) depends only on
// (seed, p) — a Philox4x32-10 block of counter p under key seed, as in Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3" (SC'11). Nothing carries over from one token to the next,
// so a request recomputed on another replica, or resumed from prompt + tokens so far, draws
// exactly what an undisturbed run drew. Every reduction runs in a fixed order (candidates
// sorted by logit, then id; masses summed in double in that order), so the choice depends on
// the logits' bits alone, not on the batch. The repetition penalty needs the request's tokens so
// far: a last stage keeps them beside its KV cache (TokenHistory), rebuilt as the cache is.
// The functions are pure and thread-safe; a TokenHistory is thread-compatible.
#ifndef CONNEX_ENGINE_SAMPLER_H_
#define CONNEX_ENGINE_SAMPLER_H_

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "connex/pp/engine.h"

namespace connex::engine {

// Philox4x32-10 of `counter` under `key`.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// The uniform draw in [0, 1) (53 bits) for the token at `position` of a request with `seed`.
double UniformAt(uint64_t seed, uint64_t position);

// The token chosen from `logits` (one row, the vocabulary) for the token at `position`, in
// vLLM's order: first the repetition penalty on the logits of every token id in `history` (the
// request's prompt and output so far; ids outside the vocabulary are ignored, a repeated id
// counts once); then greedy (the first maximum) when `sampling.greedy()`; otherwise
// softmax(logits / temperature) over the tokens at least min_p times as probable as the most
// probable and among the top_k most probable, cut to the smallest prefix whose mass reaches top_p
// of theirs, and a draw of UniformAt(seed, position) on that prefix. `sampling` must be valid.
int32_t SampleToken(std::span<const float> logits, const pp::Sampling& sampling, uint64_t position,
                    std::span<const int32_t> history = {});

// Sorts SampleToken's candidate keys (a logit's order key << 32 | its id) ascending, when the
// ids ascend along `keys` as SampleToken builds them: then a stable sort on the upper 32 bits
// (three radix passes) gives std::sort's order, several times faster on a 128K vocabulary.
void SortCandidateKeys(std::vector<uint64_t>& keys);

// `logits` with the repetition penalty applied to the ids of `history` (vLLM's and Hugging
// Face's rule: a positive logit divided by `penalty`, another multiplied by it).
void ApplyRepetitionPenalty(std::span<float> logits, float penalty,
                            std::span<const int32_t> history);

// The tokens a last stage has seen of each request with a repetition penalty, in position order
// (prompt, then generated): the history its next token is penalized with. It is request state
// beside the KV cache, with the cache's lifetime: a step at start_position s cuts it back to s and
// appends the step's tokens (sampling.history), a step at 0 starts it afresh — so a recompute
// (prompt + generated, re-sent from 0) rebuilds it exactly — and Release drops it. A replacement
// stage holds none, like its KV cache, and reports the request missing; the owner recomputes it.
class TokenHistory {
 public:
  // Whether step `in` (batch `ids`, `starts`, `counts` and its `sampling`) can be recorded: a
  // penalized request needs sampling.history, and a held history of at least its start
  // position when it does not start afresh. InvalidArgument (named) otherwise; nothing changes.
  absl::Status Check(const pp::TensorDict& in, std::span<const uint64_t> ids,
                     std::span<const int64_t> starts, std::span<const int64_t> counts,
                     std::span<const pp::Sampling> sampling) const;
  // Records step `in`, which Check accepted, for its penalized requests.
  void Record(const pp::TensorDict& in, std::span<const uint64_t> ids,
              std::span<const int64_t> starts, std::span<const int64_t> counts,
              std::span<const pp::Sampling> sampling);
  // The tokens of `id` (empty when none are held); a state export takes its rows from here.
  std::span<const int32_t> Of(uint64_t id) const;
  int64_t Size(uint64_t id) const { return static_cast<int64_t>(Of(id).size()); }
  // Appends `rows` (an imported state's) at position `from`, which must be exactly the number
  // of tokens held (0: starts afresh, whatever was held is dropped). `rows` must not be empty.
  void Append(uint64_t id, int64_t from, std::span<const int32_t> rows);
  // Keeps the first `size` tokens of `id` (0: as Release). No-op when it holds no more.
  void CutBack(uint64_t id, int64_t size);
  void Release(uint64_t id) { tokens_.erase(id); }
  void Clear() { tokens_.clear(); }
  size_t size() const { return tokens_.size(); }

 private:
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> tokens_;
};

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_SAMPLER_H_
