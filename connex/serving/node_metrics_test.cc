#include "connex/serving/node_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace connex::serving {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RenderNodeStatsTest, EveryFieldIsAFamilyCountersWithTotal) {
  pp::StageNodeStats s;
  s.steps_executed = 7;
  s.fenced = 2;
  s.held_requests = 3;
  s.requests_in_flight = 1;
  std::string text = RenderNodeStats(s);
  EXPECT_THAT(text, HasSubstr("# TYPE connex_stage_steps_executed_total counter\n"
                              "connex_stage_steps_executed_total 7\n"));
  EXPECT_THAT(text, HasSubstr("connex_stage_fenced_total 2\n"));
  EXPECT_THAT(text,
              HasSubstr("# TYPE connex_stage_held_requests gauge\nconnex_stage_held_requests 3\n"));
  EXPECT_THAT(text, HasSubstr("connex_stage_requests_in_flight 1\n"));
  EXPECT_THAT(text, HasSubstr("connex_stage_releases_pending 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("held_requests_total")));
  // 15 counters and 6 gauges, each with HELP, TYPE and one sample.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 21 * 3);
}

}  // namespace
}  // namespace connex::serving
