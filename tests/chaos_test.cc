// connex-chaos as CI runs it: every campaign for tens of seconds on a deployment the tool starts
// itself (real connex-directory, connex-stage and connex-proxy processes, SIGKILLed, SIGSTOPped
// and cut off), its record read back from --json. The assertions are about correctness only —
// every completed request equals connex-generate, nothing is lost with the proxy, a replaced
// process runs no step after it is back — never about speed (docs/results.md has the figures).
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "connex/base/subprocess.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/cluster.h"
#include "connex/chaos/reference.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::chaos {
namespace {

using ::testing::HasSubstr;

struct ChaosRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  nlohmann::json record;
};

// Runs connex-chaos with `args` and reads its --json record.
ChaosRun Chaos(std::vector<std::string> args, int64_t timeout_ms = 240'000) {
  static int n = 0;
  const std::string json_path = ::testing::TempDir() + "/chaos-" + std::to_string(getpid()) + "-" +
                                std::to_string(n++) + ".json";
  std::vector<std::string> argv = {BinDir() + "/connex-chaos"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--json", json_path});
  ChaosRun run;
  std::optional<Subprocess> p = Subprocess::Start(argv, {}, /*capture_stderr=*/true);
  if (!p) return run;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline && p->ReadLine(timeout_ms)) {
  }
  run.output = p->transcript();
  std::optional<int> code = p->Wait(5'000);
  if (!code) {
    p->Signal(SIGTERM);  // it removes what it made
    code = p->Wait(30'000);
  }
  run.exit_code = code.value_or(-1);
  std::ifstream in(json_path);
  if (in) run.record = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove(json_path);
  return run;
}

// The deployment of every campaign here: 2 replicas of a 4-stage pipeline, short requests.
const std::vector<std::string> kSmall = {"--replicas", "2", "--stages", "4", "--max-tokens", "32"};

std::vector<std::string> With(std::vector<std::string> args) {
  args.insert(args.end(), kSmall.begin(), kSmall.end());
  return args;
}

void ExpectCorrect(const ChaosRun& run) {
  ASSERT_TRUE(run.record.is_object()) << run.output;
  const nlohmann::json& t = run.record["totals"];
  EXPECT_GT(t["tokens_compared"].get<int64_t>(), 0) << run.output;
  EXPECT_EQ(t["mismatched_tokens"].get<int64_t>(), 0) << run.output;
  EXPECT_EQ(t["failed"].get<int64_t>(), 0) << run.output;
  EXPECT_EQ(t["correct"], t["issued"]) << run.output;
  EXPECT_TRUE(run.record["ok"].get<bool>()) << run.output;
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST(ChaosTest, KillOfEveryStageKeepsEveryTokenExact) {
  ChaosRun run = Chaos(With({"failover", "--runs", "4", "--fault", "kill", "--batch", "4"}));
  ExpectCorrect(run);
  ASSERT_EQ(run.record["runs"].size(), 4u) << run.output;
  std::set<int> stages;
  for (const auto& r : run.record["runs"]) stages.insert(r["stage"].get<int>());
  EXPECT_EQ(stages, (std::set<int>{0, 1, 2, 3}));  // every stage, stage 0 through the proxy
  EXPECT_GT(run.record["totals"]["fault_to_next_token_ms"]["n"].get<int64_t>(), 0);
}

// Issue 23: the drain campaign. `connexctl drain` of every stage, stage 0 included (through the
// proxy): every completion exact, nothing failed, and each drained process exits 0 by itself.
TEST(ChaosTest, DrainOfEveryStageExitsZeroAndKeepsEveryTokenExact) {
  ChaosRun run = Chaos(With({"failover", "--runs", "4", "--fault", "drain", "--batch", "4"}));
  ExpectCorrect(run);
  ASSERT_EQ(run.record["runs"].size(), 4u) << run.output;
  std::set<int> stages;
  for (const auto& r : run.record["runs"]) {
    stages.insert(r["stage"].get<int>());
    EXPECT_EQ(r["exit_code"], 0) << r.dump();
  }
  EXPECT_EQ(stages, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(run.record["totals"]["goodput"].get<double>(), 1.0) << run.output;
}

// Issue 23: load past stage 0's KV budget. Every refusal is a 429 with Retry-After, every
// admitted request exact, and /health answers throughout (its latency printed in the report).
TEST(ChaosTest, OverloadIsRefusedWith429sAndWhatIsAdmittedIsExact) {
  // 256 tokens cost 532 KiB of a stage's KV on this model: one request fits each stage 0's 1 MiB
  // and none may wait, so requests that arrive while one runs are refused, whatever the speed.
  ChaosRun run =
      Chaos({"overload", "--qps", "24", "--duration", "6", "--kv-budget", "1M", "--queue-max", "0",
             "--replicas", "2", "--stages", "4", "--max-tokens", "256"});
  ExpectCorrect(run);
  const nlohmann::json& t = run.record["totals"];
  EXPECT_GT(t["refused_429"].get<int64_t>(), 0) << run.output;
  EXPECT_EQ(t["refused_without_retry_after"].get<int64_t>(), 0) << run.output;
  EXPECT_EQ(t["health_failed"].get<int64_t>(), 0) << run.output;
  EXPECT_GT(t["health"]["n"].get<int64_t>(), 0) << run.output;
}

// A hung stage (SIGSTOP) is suspected, probed and replaced; once it runs again (SIGCONT) it must
// not execute a single step under the epoch it lost.
TEST(ChaosTest, StoppedStageIsReplacedAndFencedWhenItComesBack) {
  ChaosRun run = Chaos(
      With({"failover", "--runs", "2", "--kill-stage", "2", "--fault", "stop", "--batch", "4"}));
  ExpectCorrect(run);
  EXPECT_EQ(run.record["totals"]["fence_checks"].get<int64_t>(), 2) << run.output;
  EXPECT_EQ(run.record["totals"]["steps_executed_by_fenced_processes"].get<int64_t>(), 0)
      << run.output;
}

// A stage whose links are cut while it stays alive (its own network namespace, its veth down).
TEST(ChaosTest, PartitionedStageIsReplacedAndFencedWhenItsLinkIsBack) {
  if (absl::Status can = NetnsAvailable(); !can.ok()) {
    GTEST_SKIP() << "network namespaces cannot be made here: " << can.message();
  }
  ChaosRun run = Chaos(With(
      {"failover", "--runs", "2", "--kill-stage", "1", "--fault", "partition", "--batch", "4"}));
  ExpectCorrect(run);
  EXPECT_FALSE(run.record.contains("skipped"));
  EXPECT_EQ(run.record["totals"]["steps_executed_by_fenced_processes"].get<int64_t>(), 0)
      << run.output;
}

TEST(ChaosTest, ChurnThroughTheProxyLosesNothing) {
  ChaosRun run = Chaos(With({"churn", "--qps", "2", "--duration", "16", "--kill-every", "6"}));
  ExpectCorrect(run);
  EXPECT_EQ(run.record["totals"]["goodput"].get<double>(), 1.0) << run.output;
  EXPECT_EQ(run.record["faults"].get<int64_t>(), 2) << run.output;
}

TEST(ChaosTest, SoftChurnWithoutTheProxyLosesNothing) {
  // A graceful leave drains: even without the proxy no request is lost.
  ChaosRun run = Chaos(With(
      {"churn", "--qps", "2", "--duration", "14", "--kill-every", "6", "--no-proxy", "--soft"}));
  ExpectCorrect(run);
  EXPECT_EQ(run.record["totals"]["goodput"].get<double>(), 1.0) << run.output;
}

TEST(ChaosTest, SteadyMeasuresEveryRateAndK) {
  ChaosRun run = Chaos(
      With({"steady", "--qps", "2", "--inflight", "1,4", "--duration", "4", "--clients", "4"}));
  ExpectCorrect(run);
  ASSERT_EQ(run.record["open_loop"].size(), 2u) << run.output;
  ASSERT_EQ(run.record["closed_loop"].size(), 2u) << run.output;
  for (const auto& row : run.record["closed_loop"]) {
    EXPECT_GT(row["tokens_per_s"].get<double>(), 0);
  }
}

TEST(ChaosTest, ProxyCostComparesTheSameRequests) {
  ChaosRun run = Chaos(With({"proxy-cost", "--requests", "4"}));
  ExpectCorrect(run);
  EXPECT_EQ(run.record["direct"]["e2e_ms"]["n"].get<int64_t>(), 4);
  EXPECT_EQ(run.record["proxy"]["e2e_ms"]["n"].get<int64_t>(), 4);
}

// `make demo` (connex-chaos demo) with shorter phases: a middle stage and a stage 0 SIGKILLed
// under a streaming load through the proxy; every completion exact, each kill met streams in
// flight that all went on and was noticed, and every process exits 0 on SIGTERM.
TEST(ChaosTest, DemoRidesOutAMiddleStageAndAStageZeroKill) {
  ChaosRun run = Chaos({"demo", "--phase", "4", "--clients", "3"});
  ExpectCorrect(run);
  ASSERT_EQ(run.record["kills"].size(), 2u) << run.output;
  for (const auto& k : run.record["kills"]) {
    EXPECT_GT(k["in_flight"].get<int64_t>(), 0) << k.dump();
    EXPECT_FALSE(k["noticed"].is_null()) << k.dump();
  }
  EXPECT_TRUE(run.record["shutdown"].empty()) << run.output;
  EXPECT_THAT(run.output, HasSubstr("=== connex demo report ==="));
  EXPECT_THAT(run.output, HasSubstr("result       PASSED"));
}

// --directory: the same measurement of a deployment somebody else started (here this test,
// through Cluster), found through its directory.
TEST(ChaosTest, SteadyMeasuresARunningDeploymentThroughItsDirectory) {
  const std::string work = ::testing::TempDir() + "/chaos-attach-" + std::to_string(getpid());
  std::filesystem::create_directories(work);
  ClusterOptions co;
  co.bin_dir = BinDir();
  co.work_dir = work;
  co.stages = 2;
  co.proxy = false;
  absl::StatusOr<std::unique_ptr<Cluster>> deployment = Cluster::Start(co);
  ASSERT_TRUE(deployment.ok()) << deployment.status();
  ChaosRun run =
      Chaos({"steady", "--directory", (*deployment)->directory(), "--model",
             (*deployment)->model_path(), "--stages", "2", "--replicas", "1", "--inflight", "4",
             "--qps", "2", "--duration", "3", "--clients", "2", "--max-tokens", "16"});
  ExpectCorrect(run);
  // Both replicas found (--replicas does not apply to a deployment it did not start).
  EXPECT_EQ(run.record["options"]["replicas"].get<int>(), 2) << run.output;
  // Faults need processes of its own.
  run = Chaos({"failover", "--directory", (*deployment)->directory()}, 30'000);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--directory"));
  deployment->reset();
  std::filesystem::remove_all(work);
}

TEST(ChaosTest, BadFlagsExitTwoNamingTheFlag) {
  ChaosRun run = Chaos({"failover", "--fault", "melt"}, 30'000);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--fault"));
  run = Chaos({"failover", "--kill-stage", "7", "--stages", "4"}, 60'000);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--kill-stage 7"));
  run = Chaos({"steady", "--qps", "2,x"}, 30'000);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--qps"));
  run = Chaos({"demo", "--clients", "0"}, 30'000);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--clients"));
  run = Chaos({"demo", "--bin", "/nonexistent"}, 30'000);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--bin-dir"));
  run = Chaos({"demo", "--max-tokens", "8"}, 30'000);  // the demo's requests are its own
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--max-tokens"));
  run = Chaos({}, 30'000);
  EXPECT_EQ(run.exit_code, 2) << run.output;
}

// The pieces.
TEST(ChaosUnitTest, MetricsAreParsedWithTheirLabels) {
  auto m = ParseMetrics(
      "# HELP x\n# TYPE x counter\nconnex_stage_steps_executed_total 12\n"
      "connex_stage_epoch_steps_executed_total{epoch=\"7\"} 3\nbroken line\n");
  EXPECT_EQ(m.at("connex_stage_steps_executed_total"), 12);
  EXPECT_EQ(m.at("connex_stage_epoch_steps_executed_total{epoch=\"7\"}"), 3);
  EXPECT_EQ(m.size(), 2u);
}

TEST(ChaosUnitTest, DemoReportListsWhatFailed) {
  const nlohmann::json kill = {{"lid", "tiny/g2/s0/r0"},
                               {"what", "a middle stage"},
                               {"at_s", 10.0},
                               {"in_flight", 0},
                               {"next_token_ms", nlohmann::json::array()},
                               {"noticed", nullptr},
                               {"restart_s", 0.2},
                               {"epoch", 7},
                               {"retries", nullptr}};
  const nlohmann::json record = {
      {"campaign", "demo"},
      {"machine", {{"cores", 2}, {"date", "2026-12-05T00:00:00Z"}}},
      {"options", {{"model", "m"}, {"clients", 4}}},
      {"deployment",
       {{"replicas", 2},
        {"stages", 4},
        {"model_name", "tiny"},
        {"backend", "tcp"},
        {"proxy", true}}},
      {"totals",
       {{"completed", 3},
        {"correct", 2},
        {"failed", 1},
        {"greedy", 2},
        {"sampled", 1},
        {"tokens_streamed", 300},
        {"load_s", 30.0},
        {"median_token_gap_ms", 8.0},
        {"goodput_tokens_per_s", 6.7},
        {"reference_s", 1.0}}},
      {"kills", {kill}},
      {"restarted_stage0_completed", nullptr},
      {"shutdown", {"connex-proxy exited 1 on SIGTERM"}},
      {"problems", {"the kill of tiny/g2/s0/r0 found no stream in flight"}},
      {"ok", false}};
  const std::string report = Summary(record);
  EXPECT_THAT(report, HasSubstr("=== connex demo report ==="));
  EXPECT_THAT(report, HasSubstr("noticed: NOT NOTICED"));
  EXPECT_THAT(report, HasSubstr("exactness    2/3 completions identical"));
  EXPECT_THAT(report, HasSubstr("shutdown     1 problems"));
  EXPECT_THAT(report, HasSubstr("result       FAILED\n  - the kill of tiny/g2/s0/r0 found no"));
}

TEST(ChaosUnitTest, TokensAreComparedPositionByPosition) {
  EXPECT_EQ(CompareTokens({1, 2, 3}, {1, 2, 3}).mismatched, 0);
  Comparison c = CompareTokens({1, 9, 3}, {1, 2, 3, 4});
  EXPECT_EQ(c.compared, 4);
  EXPECT_EQ(c.mismatched, 2);  // one differs, one is missing
}

// A request's body carries its sampling as connex-generate (--generation-config none) is given
// it: every sampling field, so that no server default (a model's generation_config.json) applies;
// a seed when sampled.
TEST(ChaosUnitTest, RequestBodiesCarryTheirSampling) {
  const nlohmann::json greedy =
      nlohmann::json::parse(RequestSpec{.prompt = "p", .max_tokens = 4}.Body("tiny"));
  EXPECT_EQ(greedy["temperature"], 0);
  EXPECT_FALSE(greedy.contains("seed"));
  EXPECT_EQ(greedy["top_p"], 1);
  EXPECT_EQ(greedy["top_k"], -1);
  EXPECT_EQ(greedy["min_p"], 0);
  EXPECT_EQ(greedy["repetition_penalty"], 1);
  EXPECT_EQ(greedy["stream_options"]["include_usage"], true);
  const nlohmann::json nucleus = nlohmann::json::parse(
      RequestSpec{.prompt = "p", .max_tokens = 4, .temperature = 0.5f, .top_p = 0.5f, .seed = 9}
          .Body("tiny"));
  EXPECT_EQ(nucleus["temperature"], 0.5);
  EXPECT_EQ(nucleus["top_p"], 0.5);
  EXPECT_EQ(nucleus["seed"], 9);
}

// References of one-line prompts are computed in batches, a prompt of several lines (a rendered
// chat) alone; each sampling setting, top_p included, is a reference of its own.
TEST(ChaosTest, ReferencesOfEveryKindOfPromptAreFound) {
  const std::string work = ::testing::TempDir() + "/chaos-refs-" + std::to_string(getpid());
  std::filesystem::create_directories(work);
  const std::string model = work + "/model.safetensors";
  ASSERT_TRUE(MakeModel(BinDir(), model, {"--layers", "2", "--dim", "64", "--ffn", "128"}).ok());
  References refs(BinDir() + "/connex-generate", model, 2, work);
  const std::vector<RequestSpec> specs = {
      {.prompt = "one line", .max_tokens = 6},
      {.prompt = "another line", .max_tokens = 6},
      {.prompt = "<|user|>\nseveral\nlines\n<|assistant|>\n", .max_tokens = 6},
      {.prompt = "one line", .max_tokens = 6, .temperature = 0.8f, .top_p = 0.9f, .seed = 3}};
  absl::Status computed = refs.Compute(specs);
  ASSERT_TRUE(computed.ok()) << computed;
  for (const RequestSpec& spec : specs) {
    const Reference* want = refs.Find(spec);
    ASSERT_NE(want, nullptr) << spec.prompt;
    EXPECT_FALSE(want->tokens.empty()) << spec.prompt;
  }
  EXPECT_EQ(refs.Find({.prompt = "one line", .max_tokens = 6, .temperature = 0.8f, .seed = 3}),
            nullptr);
  std::filesystem::remove_all(work);
}

TEST(ChaosUnitTest, HostPortsAreCheckedByName) {
  EXPECT_EQ(ParseHostPort("x", "127.0.0.1:80")->port, 80);
  EXPECT_THAT(std::string(ParseHostPort("--proxy", "nowhere").status().message()),
              HasSubstr("--proxy"));
  EXPECT_FALSE(ParseHostPort("x", "h:70000").ok());
}

}  // namespace
}  // namespace connex::chaos
