#include "connex/serving/metrics.h"

#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The text exposition format, read back: samples by "name{labels}", and the HELP / TYPE lines.
struct Exposition {
  std::map<std::string, std::string> samples;
  std::vector<std::string> comments;
  std::vector<std::string> order;  // sample keys as they appeared
};

Exposition Parse(const std::string& text) {
  Exposition out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    EXPECT_FALSE(line.empty()) << "blank line in:\n" << text;
    if (line.rfind("#", 0) == 0) {
      out.comments.push_back(line);
      continue;
    }
    // The value follows the last space; label values here hold no spaces after a '}'.
    size_t space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    std::string key = line.substr(0, space);
    EXPECT_EQ(out.samples.count(key), 0u) << "duplicate sample " << key;
    out.samples[key] = line.substr(space + 1);
    out.order.push_back(key);
  }
  EXPECT_TRUE(text.empty() || text.back() == '\n');
  return out;
}

TEST(MetricsTest, CountersWithLabelsAndGauges) {
  MetricsRegistry registry;
  CounterFamily& success = registry.AddCounter("connex_request_success_total",
                                               "Requests that finished.", {"finished_reason"});
  GaugeFamily& running = registry.AddGauge("connex_requests_running", "Requests running now.");
  success.WithLabels({"stop"}).Increment();
  success.WithLabels({"stop"}).Increment(2);
  success.WithLabels({"length"}).Increment();
  running.Get().Increment(3);
  running.Get().Decrement();

  Exposition e = Parse(registry.Render());
  EXPECT_EQ(e.samples["connex_request_success_total{finished_reason=\"stop\"}"], "3");
  EXPECT_EQ(e.samples["connex_request_success_total{finished_reason=\"length\"}"], "1");
  EXPECT_EQ(e.samples["connex_requests_running"], "2");
  EXPECT_THAT(e.comments, ElementsAre("# HELP connex_request_success_total Requests that finished.",
                                      "# TYPE connex_request_success_total counter",
                                      "# HELP connex_requests_running Requests running now.",
                                      "# TYPE connex_requests_running gauge"));
  // Registering again returns the same family.
  EXPECT_EQ(&registry.AddGauge("connex_requests_running", "again"), &running);
  EXPECT_EQ(success.WithLabels({"stop"}).value(), 3.0);
}

TEST(MetricsTest, UnlabelledSeriesRenderAtZero) {
  MetricsRegistry registry;
  registry.AddCounter("connex_failovers_total", "Failovers.");
  registry.AddCounter("connex_labelled_total", "Labelled.", {"kind"});
  Exposition e = Parse(registry.Render());
  EXPECT_EQ(e.samples["connex_failovers_total"], "0");
  EXPECT_EQ(e.samples.size(), 1u);  // a labelled family has no series until one is used
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  MetricsRegistry registry;
  HistogramFamily& ttft = registry.AddHistogram("connex_time_to_first_token_seconds",
                                                "Time to first token.", {0.1, 0.5, 1});
  Histogram& h = ttft.Get();
  for (double v : {0.05, 0.1, 0.3, 0.7, 2.0}) h.Observe(v);
  Exposition e = Parse(registry.Render());
  const std::string n = "connex_time_to_first_token_seconds";
  EXPECT_EQ(e.samples[n + "_bucket{le=\"0.1\"}"], "2");  // le is inclusive
  EXPECT_EQ(e.samples[n + "_bucket{le=\"0.5\"}"], "3");
  EXPECT_EQ(e.samples[n + "_bucket{le=\"1\"}"], "4");
  EXPECT_EQ(e.samples[n + "_bucket{le=\"+Inf\"}"], "5");
  EXPECT_EQ(e.samples[n + "_count"], "5");
  EXPECT_DOUBLE_EQ(std::stod(e.samples[n + "_sum"]), 3.15);
  EXPECT_THAT(e.order, ElementsAre(n + "_bucket{le=\"0.1\"}", n + "_bucket{le=\"0.5\"}",
                                   n + "_bucket{le=\"1\"}", n + "_bucket{le=\"+Inf\"}", n + "_sum",
                                   n + "_count"));
  EXPECT_EQ(e.comments[1], "# TYPE " + n + " histogram");
}

TEST(MetricsTest, LabelledHistogramAndEscaping) {
  MetricsRegistry registry;
  HistogramFamily& latency = registry.AddHistogram(
      "connex_e2e_request_latency_seconds", "Line one\nand \\ two.", LatencyBuckets(), {"route"});
  latency.WithLabels({"a\"b\\c\nd"}).Observe(0.002);
  std::string text = registry.Render();
  Exposition e = Parse(text);
  EXPECT_EQ(e.comments[0], "# HELP connex_e2e_request_latency_seconds Line one\\nand \\\\ two.");
  EXPECT_EQ(e.samples["connex_e2e_request_latency_seconds_bucket{route=\"a\\\"b\\\\c\\nd\","
                      "le=\"0.001\"}"],
            "0");
  EXPECT_EQ(e.samples["connex_e2e_request_latency_seconds_bucket{route=\"a\\\"b\\\\c\\nd\","
                      "le=\"0.005\"}"],
            "1");
  EXPECT_EQ(e.samples["connex_e2e_request_latency_seconds_count{route=\"a\\\"b\\\\c\\nd\"}"], "1");
}

TEST(MetricsTest, ConcurrentUpdatesAreAllCounted) {
  MetricsRegistry registry;
  CounterFamily& tokens = registry.AddCounter("connex_generation_tokens_total", "Tokens.");
  HistogramFamily& itl =
      registry.AddHistogram("connex_inter_token_latency_seconds", "ITL.", {0.5}, {"stage"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        tokens.Get().Increment();
        itl.WithLabels({t % 2 == 0 ? "even" : "odd"}).Observe(i % 2 == 0 ? 0.25 : 1.0);
        if (i % 1000 == 0) (void)registry.Render();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  Exposition e = Parse(registry.Render());
  EXPECT_EQ(e.samples["connex_generation_tokens_total"], "40000");
  EXPECT_EQ(e.samples["connex_inter_token_latency_seconds_count{stage=\"even\"}"], "20000");
  EXPECT_EQ(e.samples["connex_inter_token_latency_seconds_bucket{stage=\"odd\",le=\"0.5\"}"],
            "10000");
}

// Dashboards built for vLLM read its names: the request metrics are rendered a second time
// under them, with the model's name as a label, from the same series.
TEST(MetricsTest, RequestMetricsCarryVllmAliasesWithTheModelName) {
  MetricsRegistry registry;
  RequestMetrics requests(registry);
  requests.AddVllmAliases("tiny\"model");
  requests.Accepted();
  requests.Accepted();
  requests.FirstToken();
  requests.ttft.Observe(0.02);
  requests.success.WithLabels({"stop"}).Increment();
  requests.Ended(/*got_token=*/false);
  const std::string out = registry.Render();
  EXPECT_THAT(out, HasSubstr("connex_requests_running 1\n"));
  EXPECT_THAT(out, HasSubstr("connex_requests_waiting 0\n"));
  EXPECT_THAT(out, HasSubstr("# TYPE vllm:num_requests_running gauge\n"));
  EXPECT_THAT(out, HasSubstr("vllm:num_requests_running{model_name=\"tiny\\\"model\"} 1\n"));
  EXPECT_THAT(out, HasSubstr("vllm:num_requests_waiting{model_name=\"tiny\\\"model\"} 0\n"));
  EXPECT_THAT(out, HasSubstr("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\\\"model\","
                             "le=\"0.025\"} 1\n"));
  EXPECT_THAT(out, HasSubstr("vllm:request_success_total{model_name=\"tiny\\\"model\","
                             "finished_reason=\"stop\"} 1\n"));
  for (const char* name : {"vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
                           "vllm:prompt_tokens_total", "vllm:generation_tokens_total"}) {
    EXPECT_THAT(out, HasSubstr(std::string("# TYPE ") + name)) << name;
  }
}

TEST(MetricsDeathTest, MisuseAborts) {
  MetricsRegistry registry;
  EXPECT_DEATH(registry.AddCounter("bad name", "x"), "invalid metric name");
  CounterFamily& family = registry.AddCounter("ok_total", "x", {"a"});
  EXPECT_DEATH(family.WithLabels({}), "has 1 labels, got 0");
  EXPECT_DEATH(registry.AddGauge("ok_total", "x"), "different types");
  EXPECT_DEATH(registry.AddHistogram("h", "x", {1, 0.5}), "ascending");
}

}  // namespace
}  // namespace connex::serving
