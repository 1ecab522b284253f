// The prompts pp_test_node submits, shared with the tests that check its tokens.
#ifndef CONNEX_TESTS_PP_PROMPTS_H_
#define CONNEX_TESTS_PP_PROMPTS_H_

#include <cstdint>
#include <vector>

namespace connex::testing {

inline std::vector<int32_t> PromptOf(uint64_t id) {
  std::vector<int32_t> p;
  for (uint64_t i = 0; i < 2 + id % 7; ++i)
    p.push_back(static_cast<int32_t>((id * 37 + i * 11) % 200));
  return p;
}

}  // namespace connex::testing

#endif  // CONNEX_TESTS_PP_PROMPTS_H_
