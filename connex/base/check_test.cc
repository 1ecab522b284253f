#include "connex/base/check.h"

#include "gtest/gtest.h"

namespace connex {
namespace {

TEST(CheckTest, AHoldingInvariantDoesNothing) {
  int evaluated = 0;
  CONNEX_CHECK(++evaluated == 1);
  EXPECT_EQ(evaluated, 1);  // evaluated exactly once
}

TEST(CheckDeathTest, ABrokenInvariantAbortsNamingTheConditionAndWhere) {
  int slots = 2;
  EXPECT_DEATH(CONNEX_CHECK(slots == 3),
               "CONNEX_CHECK failed at .*check_test.cc:[0-9]+: slots == 3");
}

}  // namespace
}  // namespace connex
