// The end-of-test checks that the KV standby's and prefill-decode's tests share (gtest).
#ifndef CONNEX_PP_TESTING_EXPECTATIONS_H_
#define CONNEX_PP_TESTING_EXPECTATIONS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "connex/base/wait.h"
#include "connex/pp/testing/cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp::testing {

// Every request finished, with exactly the tokens `reference(id)` says (an undisturbed run's),
// streamed once each; no engine ran a step twice.
inline void ExpectAllMatch(const Cluster& c,
                           const std::function<std::vector<int32_t>(uint64_t id)>& reference) {
  for (const auto& [id, o] : c.outcomes()) {
    ASSERT_TRUE(o.done) << "request " << id;
    ASSERT_TRUE(o.tokens.ok()) << "request " << id << ": " << o.tokens.status();
    EXPECT_EQ(*o.tokens, reference(id)) << "request " << id;
    EXPECT_EQ(o.streamed, *o.tokens) << "request " << id;
  }
  EXPECT_THAT(c.violations(), ::testing::IsEmpty());
}

// Every request ended: no engine holds state, no mirror is left, no ring slot is in use.
inline void ExpectNothingLeft(Cluster& c) {
  EXPECT_TRUE(c.AwaitNoStateHeld(10000)) << c.StateHeld();
  EXPECT_TRUE(WaitUntil([&] { return c.MirrorsHeld() == 0; }, 10000))
      << c.MirrorsHeld() << " mirrors left";
  EXPECT_TRUE(c.AwaitRingsEmpty(5000));
}

}  // namespace connex::pp::testing

#endif  // CONNEX_PP_TESTING_EXPECTATIONS_H_
