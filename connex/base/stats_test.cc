#include "connex/base/stats.h"

#include "gtest/gtest.h"

namespace connex {
namespace {

TEST(PercentileTest, NearestRank) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_EQ(Percentile({7}, 0.99), 7);
  std::vector<double> v = {5, 1, 4, 2, 3};
  EXPECT_EQ(Percentile(v, 0.0), 1);
  EXPECT_EQ(Percentile(v, 0.5), 3);
  EXPECT_EQ(Percentile(v, 1.0), 5);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 0.5), 3);  // rank 1.5 rounds up
}

}  // namespace
}  // namespace connex
