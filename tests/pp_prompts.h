// The prompts pp_test_node submits, shared with the tests that check its tokens.
#ifndef CONNEX_TESTS_PP_PROMPTS_H_
#define CONNEX_TESTS_PP_PROMPTS_H_

#include <cstdint>
#include <vector>

#include "connex/pp/engine.h"

namespace connex::testing {

inline std::vector<int32_t> PromptOf(uint64_t id) {
  std::vector<int32_t> p;
  for (uint64_t i = 0; i < 2 + id % 7; ++i)
    p.push_back(static_cast<int32_t>((id * 37 + i * 11) % 200));
  return p;
}

// Request `id`'s prompt of `length` tokens (0: PromptOf(id)), for runs over a longer context.
inline std::vector<int32_t> PromptOf(uint64_t id, int64_t length) {
  if (length <= 0) return PromptOf(id);
  std::vector<int32_t> p;
  for (int64_t i = 0; i < length; ++i) {
    p.push_back(static_cast<int32_t>((id * 37 + static_cast<uint64_t>(i) * 11 + i / 13) % 200));
  }
  return p;
}

// How request `id` samples in runs with --sampled: even ids greedy, odd ids sampled with a seed
// of their own (and every third of those with a repetition penalty).
inline pp::Sampling SamplingOf(uint64_t id) {
  pp::Sampling s;
  if (id % 2 == 0) return s;
  s.temperature = 0.8f;
  s.top_p = 0.9f;
  s.top_k = 40;
  s.seed = id * 7919 + 1;
  if (id % 3 == 0) s.repetition_penalty = 1.2f;
  return s;
}

}  // namespace connex::testing

#endif  // CONNEX_TESTS_PP_PROMPTS_H_
