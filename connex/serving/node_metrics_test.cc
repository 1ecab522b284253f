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
  // 36 counters (10 of them KV standby's and prefill-decode's, 2 in seconds) and 15 gauges, each
  // with HELP, TYPE and one sample; the two per-epoch families
  // have HELP and TYPE, and no sample without epochs; the KV standby's lag histogram has HELP,
  // TYPE, 7 buckets and its count.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 51 * 3 + 2 * 2 + 10);
}

TEST(RenderNodeStatsTest, TheKvStandbyLagIsACumulativeHistogramInSteps) {
  pp::StageNodeStats s;
  s.kv_standby = true;
  s.kv_standby_lag = {5, 3, 0, 1, 0, 0, 2};
  s.kv_takeovers = 4;
  s.pd_handoff_bytes = 4096;
  s.pd_handoff_wait_ms = 1500;
  s.pd_prefilling = 3;
  std::string text = RenderNodeStats(s);
  EXPECT_THAT(text, HasSubstr("connex_stage_kv_standby 1\n"));
  EXPECT_THAT(text, HasSubstr("connex_stage_kv_takeovers_total 4\n"));
  EXPECT_THAT(text, HasSubstr("connex_stage_pd_handoff_bytes_total 4096\n"));
  EXPECT_THAT(text, HasSubstr("connex_stage_pd_handoff_wait_seconds_total 1.500000\n"));
  EXPECT_THAT(text, HasSubstr("connex_stage_pd_prefilling 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE connex_stage_kv_standby_lag_steps histogram\n"
                              "connex_stage_kv_standby_lag_steps_bucket{le=\"0\"} 5\n"
                              "connex_stage_kv_standby_lag_steps_bucket{le=\"1\"} 8\n"
                              "connex_stage_kv_standby_lag_steps_bucket{le=\"2\"} 8\n"
                              "connex_stage_kv_standby_lag_steps_bucket{le=\"4\"} 9\n"
                              "connex_stage_kv_standby_lag_steps_bucket{le=\"8\"} 9\n"
                              "connex_stage_kv_standby_lag_steps_bucket{le=\"16\"} 9\n"
                              "connex_stage_kv_standby_lag_steps_bucket{le=\"+Inf\"} 11\n"
                              "connex_stage_kv_standby_lag_steps_count 11\n"));
}

TEST(RenderNodeStatsTest, PerEpochFamiliesHaveOneSampleAnEpoch) {
  pp::StageNodeStats s;
  s.epoch = 9;
  s.epochs = {{4, 120, 5'000'000'123}, {9, 3, 0}};
  std::string text = RenderNodeStats(s);
  EXPECT_THAT(text, HasSubstr("# TYPE connex_stage_epoch gauge\nconnex_stage_epoch 9\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE connex_stage_epoch_steps_executed_total counter\n"
                              "connex_stage_epoch_steps_executed_total{epoch=\"4\"} 120\n"
                              "connex_stage_epoch_steps_executed_total{epoch=\"9\"} 3\n"));
  EXPECT_THAT(
      text, HasSubstr("# TYPE connex_stage_epoch_last_step_monotonic_seconds gauge\n"
                      "connex_stage_epoch_last_step_monotonic_seconds{epoch=\"4\"} 5.000000123\n"
                      "connex_stage_epoch_last_step_monotonic_seconds{epoch=\"9\"} 0.000000000\n"));
}

}  // namespace
}  // namespace connex::serving
