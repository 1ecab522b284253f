// The serving stack end to end through the resume proxy (connex-proxy), on the fixture's
// deployment (started with connex-chaos's Cluster): stage kills and drains under streams through
// it change no token of connex-generate's (chaos::Check), for our own client and for the official
// OpenAI client library; bad input is refused by the proxy itself.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <utility>

#include "connex/base/subprocess.h"
#include "connex/base/wait.h"
#include "connex/serving/chat_template.h"
#include "connex/serving/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/serving_e2e_fixture.h"

namespace connex::testing {
namespace {

using serving::testing::TestConnection;

// The mission through the resume proxy: streams (greedy and sampled) and a whole response go
// through connex-proxy while a middle stage, the last stage and a stage 0 are killed with SIGKILL
// in turn. Every response is exactly connex-generate's — text and token ids, no token missing or
// repeated — and every killed stage, restarted under its LID, takes traffic again.
TEST_F(ServingE2eTest, ThroughTheProxyNoKillChangesAToken) {
  constexpr int kTokens = 120;
  // Prompts and seeds whose generation runs the whole length (no EOS), so that kills land
  // mid-response.
  auto full = [&](const std::string& prompt, float temperature, float top_p) {
    return RunningFullLength(
        [&](int k) {
          chaos::RequestSpec s{.prompt = prompt + " " + std::to_string(k),
                               .max_tokens = kTokens,
                               .temperature = temperature,
                               .top_p = top_p};
          if (temperature > 0) s.seed = 100 + k;
          return s;
        },
        40);
  };
  for (std::pair<int, int> victim : {std::pair{1, 0}, {2, 1}, {0, 0}}) {
    const std::string name =
        "stage " + std::to_string(victim.first) + " of replica " + std::to_string(victim.second);
    SCOPED_TRACE(name);
    std::vector<std::optional<chaos::RequestSpec>> specs = {
        full("greedy " + name, 0, 1), full("sampled " + name, 0.8f, 0.95f),
        full("greedy again " + name, 0, 1), full("whole " + name, 0.7f, 1)};
    for (const auto& s : specs) ASSERT_TRUE(s.has_value());
    Streams streams;
    std::vector<std::shared_ptr<chaos::Outcome>> outcomes;
    for (size_t i = 0; i < 3; ++i) outcomes.push_back(streams.Start(*specs[i], proxy(), "proxy"));
    // The whole one: its body without "stream".
    const chaos::RequestSpec& whole = *specs[3];
    nlohmann::json body = nlohmann::json::parse(whole.Body(kModelName));
    body.erase("stream");
    body.erase("stream_options");
    TestConnection c(proxy_port(), 60000);
    ASSERT_TRUE(c.Send("POST", "/v1/completions", body.dump()));
    ASSERT_TRUE(streams.WaitForTokens(1));
    for (const auto& o : outcomes) ASSERT_GE(o->live.Get().tokens, 1) << o->spec.prompt;
    const double resumes_before = ProxyMetric("connex_proxy_resumes_total");
    ASSERT_TRUE(cluster().Kill(victim.first, victim.second).ok());
    streams.Wait();
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->result_int(), 200) << r->body();
    outcomes.push_back(WholeOutcome(whole, "proxy (whole)", 200, r->body()));
    ExpectCorrect(outcomes);
    for (const auto& o : outcomes) EXPECT_EQ(o->result.finish_reason, "length") << o->spec.prompt;
    if (victim.first == 0) {
      // Its streams went on through the proxy, from the other replica.
      EXPECT_GT(ProxyMetric("connex_proxy_resumes_total"), resumes_before);
    }
    EXPECT_EQ(ProxyMetric("connex_request_failure_total"), 0.0);
    // The same LID comes back as a new process and takes traffic again.
    absl::Status restarted = cluster().Restart(victim.first, victim.second);
    ASSERT_TRUE(restarted.ok()) << restarted;
    ASSERT_TRUE(WaitUntil([&] { return ProxyReplicas() == 2; }, 20000));
  }
  // Both stage 0s serve through the proxy again (the one restarted included).
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitUntil([&] { return Get(r, "/health").first == 200; }, 20000));
  }
  auto served = [&](int replica) {
    std::smatch m;
    std::string metrics = Get(replica, "/metrics").second;
    if (!std::regex_search(metrics, m, std::regex("connex_generation_tokens_total ([0-9.e+]+)"))) {
      return 0.0;
    }
    return std::stod(m[1]);
  };
  const double restarted_before = served(0);
  std::vector<std::unique_ptr<TestConnection>> more;
  for (int i = 0; i < 4; ++i) {
    more.push_back(std::make_unique<TestConnection>(proxy_port(), 60000));
    ASSERT_TRUE(more.back()->Send(
        "POST", "/v1/completions",
        R"({"model": "tiny", "prompt": "after )" + std::to_string(i) + R"(", "max_tokens": 8})"));
  }
  for (int i = 0; i < 4; ++i) {
    auto r = more[i]->Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->result_int(), 200) << r->body();
    ExpectCorrect({WholeOutcome({.prompt = "after " + std::to_string(i), .max_tokens = 8}, "proxy",
                                r->result_int(), r->body())});
  }
  EXPECT_GT(served(0), restarted_before) << "the restarted stage 0 took no request";
}

// vLLM's fields through kills (issue 22): repetition_penalty (whose tokens the last stage keeps
// beside its KV cache), min_p, ignore_eos and stop_token_ids on streams and a whole response
// through the proxy, while the last stage of a replica (its history is gone with it: the
// requests are recomputed on the other replica's) and then a stage 0 (the proxy resumes its
// requests elsewhere from prompt + tokens so far) are killed with SIGKILL. Every response is
// exactly connex-generate's with the same flags: token ids, text (without the stop token's),
// finish_reason.
TEST_F(ServingE2eTest, VllmSamplingFieldsStayExactThroughKillsAndResumes) {
  constexpr int kTokens = 120;
  for (std::pair<int, int> victim : {std::pair{2, 0}, {0, 1}}) {
    const std::string name =
        "stage " + std::to_string(victim.first) + " of replica " + std::to_string(victim.second);
    SCOPED_TRACE(name);
    const std::string tag = " " + std::to_string(victim.first);
    std::vector<chaos::RequestSpec> specs = {{.prompt = "penalized greedy" + tag,
                                              .max_tokens = kTokens,
                                              .repetition_penalty = 1.3f,
                                              .ignore_eos = true},
                                             {.prompt = "penalized min_p" + tag,
                                              .max_tokens = kTokens,
                                              .temperature = 0.9f,
                                              .top_p = 0.95f,
                                              .seed = 11,
                                              .min_p = 0.1f,
                                              .repetition_penalty = 1.2f,
                                              .ignore_eos = true},
                                             {.prompt = "whole" + tag,
                                              .max_tokens = kTokens,
                                              .temperature = 0.8f,
                                              .seed = 12,
                                              .min_p = 0.05f,
                                              .repetition_penalty = 0.9f,
                                              .ignore_eos = true}};
    // A stop token id that first appears late in an undisturbed run: the request stops there.
    chaos::RequestSpec stopping{.prompt = "stop token" + tag,
                                .max_tokens = kTokens,
                                .temperature = 0.7f,
                                .seed = 13,
                                .repetition_penalty = 1.1f,
                                .ignore_eos = true};
    const std::vector<int32_t> free_run = Want(stopping).tokens;
    ASSERT_EQ(free_run.size(), static_cast<size_t>(kTokens));
    for (size_t i = 80; i < free_run.size() && stopping.stop_token_ids.empty(); ++i) {
      if (std::find(free_run.begin(), free_run.begin() + i, free_run[i]) == free_run.begin() + i) {
        stopping.stop_token_ids = {free_run[i]};
      }
    }
    ASSERT_FALSE(stopping.stop_token_ids.empty()) << "no token appears first after 80";
    specs.insert(specs.begin() + 2, stopping);
    Streams streams;
    std::vector<std::shared_ptr<chaos::Outcome>> outcomes;
    for (size_t i = 0; i < 3; ++i) outcomes.push_back(streams.Start(specs[i], proxy(), "proxy"));
    nlohmann::json body = nlohmann::json::parse(specs[3].Body(kModelName));
    body.erase("stream");
    body.erase("stream_options");
    TestConnection c(proxy_port(), 60000);
    ASSERT_TRUE(c.Send("POST", "/v1/completions", body.dump()));
    ASSERT_TRUE(streams.WaitForTokens(1));
    for (const auto& o : outcomes) ASSERT_GE(o->live.Get().tokens, 1) << o->spec.prompt;
    const double resumes_before = ProxyMetric("connex_proxy_resumes_total");
    const double reprefills_before = StageZeroSum("connex_reprefills_total");
    ASSERT_TRUE(cluster().Kill(victim.first, victim.second).ok());
    streams.Wait();
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->result_int(), 200) << r->body();
    outcomes.push_back(WholeOutcome(specs[3], "proxy (whole)", 200, r->body()));
    ExpectCorrect(outcomes);
    EXPECT_EQ(outcomes[2]->result.finish_reason, "stop");
    EXPECT_EQ(outcomes[2]->result.tokens.back(), stopping.stop_token_ids[0]);
    EXPECT_LT(outcomes[2]->result.tokens.size(), static_cast<size_t>(kTokens));
    for (size_t i : {0, 1, 3}) EXPECT_EQ(outcomes[i]->result.finish_reason, "length") << i;
    if (victim.first == 0) {
      EXPECT_GT(ProxyMetric("connex_proxy_resumes_total"), resumes_before);
    } else {
      // Some request lost its last stage's state (KV and history) and was recomputed.
      EXPECT_GT(StageZeroSum("connex_reprefills_total"), reprefills_before);
    }
    EXPECT_EQ(ProxyMetric("connex_request_failure_total"), 0.0);
    absl::Status restarted = cluster().Restart(victim.first, victim.second);
    ASSERT_TRUE(restarted.ok()) << restarted;
    ASSERT_TRUE(WaitUntil([&] { return ProxyReplicas() == 2; }, 20000));
  }
}

// The proxy answers bad input itself, with the same envelope as a stage.
TEST_F(ServingE2eTest, TheProxyRefusesBadInputAndKeepsServing) {
  for (const auto& [body, status] : std::vector<std::pair<std::string, int>>{
           {"{not json", 400},
           {R"({"model": "other", "prompt": "x"})", 404},
           {R"({"model": "tiny", "prompt": "x", "top_k": -5})", 400},
           {R"({"model": "tiny", "prompt": [1, 99999], "max_tokens": 2})", 400},  // the stage's
       }) {
    TestConnection c(proxy_port(), 60000);
    ASSERT_TRUE(c.Send("POST", "/v1/completions", body));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->result_int(), status) << body << " -> " << r->body();
    EXPECT_TRUE(nlohmann::json::parse(r->body()).contains("error")) << r->body();
  }
  TestConnection c(proxy_port(), 60000);
  ASSERT_TRUE(
      c.Send("POST", "/v1/completions", R"({"model": "tiny", "prompt": "ok", "max_tokens": 4})"));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 200) << r->body();
}

// The same through the official OpenAI client library (the `openai` npm package, run by Node):
// two streams, a chat stream and a whole response, while a stage 0 is killed with SIGKILL. The
// client sees one uninterrupted response per request — one id, text and token ids equal to
// connex-generate's — and needs no retry of its own (maxRetries: 0).
TEST_F(ServingE2eTest, TheOpenAiClientLibrarySeesUninterruptedResponsesThroughAKill) {
  const std::string client_dir = std::string(CONNEX_SOURCE_DIR) + "/tests/openai-client";
  if (!std::filesystem::exists(client_dir + "/node_modules/openai/package.json")) {
    GTEST_SKIP() << "the openai npm package is not installed in " << client_dir
                 << " (scripts/install-deps.sh runs npm ci there; it needs node, npm and the "
                    "registry)";
  }
  std::string node_binary;
  for (std::string_view path = std::getenv("PATH") ? std::getenv("PATH") : ""; !path.empty();) {
    const size_t colon = std::min(path.find(':'), path.size());
    const std::string candidate = std::string(path.substr(0, colon)) + "/node";
    if (node_binary.empty() && access(candidate.c_str(), X_OK) == 0) node_binary = candidate;
    path.remove_prefix(std::min(colon + 1, path.size()));
  }
  if (node_binary.empty()) GTEST_SKIP() << "node is not on PATH";
  constexpr int kTokens = 120;
  struct Job {
    std::string name;
    bool chat = false;
    bool stream = true;
    double temperature = 0.0;
    std::string prompt;  // completions: the prompt; chat: the user message
    int seed = 0;
    nlohmann::json want;
  };
  std::vector<Job> jobs = {{"greedy", false, true, 0.0, "client greedy", 0, {}},
                           {"sampled", false, true, 0.8, "client sampled", 0, {}},
                           {"chat", true, true, 0.0, "client chat", 0, {}},
                           {"whole", false, false, 0.7, "client whole", 0, {}}};
  for (Job& j : jobs) {
    // A prompt and seed that run the whole length (no EOS), so that the kill lands mid-response.
    std::optional<chaos::RequestSpec> spec = RunningFullLength(
        [&](int k) {
          const std::string prompt = j.prompt + " " + std::to_string(k);
          // A chat is the reference model's template rendered as the prompt (what stage 0 does).
          const std::vector<serving::ChatMessage> chat = {{"user", prompt}};
          return chaos::RequestSpec{.prompt = j.chat ? serving::RenderChatPrompt(chat) : prompt,
                                    .max_tokens = kTokens,
                                    .temperature = static_cast<float>(j.temperature),
                                    .seed = static_cast<uint64_t>(200 + k)};
        },
        40);
    ASSERT_TRUE(spec.has_value()) << j.name;
    const int k = static_cast<int>(spec->seed) - 200;
    j.prompt += " " + std::to_string(k);
    j.seed = 200 + k;
    const chaos::Reference want = Want(*spec);
    j.want = {{"tokens", want.tokens}, {"text", want.text}};
    ASSERT_EQ(j.want["tokens"].size(), static_cast<size_t>(kTokens)) << j.name;
  }
  std::vector<std::string> argv = {node_binary, client_dir + "/stream.mjs",
                                   "http://127.0.0.1:" + std::to_string(proxy_port()) + "/v1",
                                   kModelName, std::to_string(kTokens)};
  for (const Job& j : jobs) {
    nlohmann::json job = {{"name", j.name},
                          {"endpoint", j.chat ? "chat" : "completions"},
                          {"stream", j.stream},
                          {"seed", j.seed},
                          {"temperature", j.temperature}};
    if (j.chat) {
      job["messages"] = {{{"role", "user"}, {"content", j.prompt}}};
    } else {
      job["prompt"] = j.prompt;
    }
    argv.push_back(job.dump());
  }
  const double resumes_before = ProxyMetric("connex_proxy_resumes_total");
  auto node = Subprocess::Start(argv);
  ASSERT_TRUE(node.has_value());
  ASSERT_TRUE(node->WaitForLine("streaming", 60000).has_value()) << node->transcript();
  ASSERT_TRUE(cluster().Kill(0, 1).ok());
  ASSERT_TRUE(node->WaitForLine("done", 120000).has_value()) << node->transcript();
  EXPECT_EQ(node->Wait(20000), 0) << node->transcript();
  std::map<std::string, nlohmann::json> seen;
  std::istringstream lines(node->transcript());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{", 0) != 0) continue;
    nlohmann::json r = nlohmann::json::parse(line);
    seen[r["name"]] = r;
  }
  for (const Job& j : jobs) {
    SCOPED_TRACE(j.name);
    ASSERT_TRUE(seen.count(j.name)) << node->transcript();
    const nlohmann::json& r = seen[j.name];
    EXPECT_EQ(r["token_ids"], j.want["tokens"]);
    EXPECT_EQ(r["text"], j.want["text"]);
    EXPECT_EQ(r["finish_reason"], "length");
    EXPECT_EQ(r["ids"].size(), 1u) << "one response id";
  }
  EXPECT_GT(ProxyMetric("connex_proxy_resumes_total"), resumes_before);
}

// Issue 23: `connexctl drain` of a stage 0 ended every stream on it with a 400
// ("invalid_request_error: ... lost its LID") and the drained process never exited. A drained
// stage takes no new work, finishes or hands over what it has — a server-side error the proxy
// resumes elsewhere, never the client's fault — and exits 0. Streams through the proxy see
// nothing: every token is connex-generate's. A middle stage the same.
TEST_F(ServingE2eTest, ADrainedStageHandsOverItsWorkAndExitsZero) {
  constexpr int kTokens = 120;
  for (std::pair<int, int> victim : {std::pair{0, 0}, std::pair{1, 1}}) {
    const std::string name =
        "stage " + std::to_string(victim.first) + " of replica " + std::to_string(victim.second);
    SCOPED_TRACE(name);
    std::vector<chaos::RequestSpec> specs;
    for (int k = 0; specs.size() < 4 && k < 60; ++k) {
      chaos::RequestSpec spec{
          .prompt = "drain " + std::to_string(victim.first) + " " + std::to_string(k),
          .max_tokens = kTokens};
      // An early EOS: the drain would miss it.
      if (Want(spec).tokens.size() == static_cast<size_t>(kTokens)) specs.push_back(spec);
    }
    ASSERT_EQ(specs.size(), 4u);
    Streams streams;
    std::vector<std::shared_ptr<chaos::Outcome>> outcomes;
    for (const chaos::RequestSpec& spec : specs)
      outcomes.push_back(streams.Start(spec, proxy(), "proxy"));
    ASSERT_TRUE(streams.WaitForTokens(1));
    for (const auto& o : outcomes) ASSERT_GE(o->live.Get().tokens, 1) << o->spec.prompt;
    const std::string lid = cluster().lid(victim.first, victim.second).ToString();
    auto drain = Subprocess::Start(
        {BinDir() + "/connexctl", "--directory", cluster().directory(), "drain", lid},
        {"CONNEX_DIRECTORY_ADMIN_TOKEN=" + cluster().admin_token()}, true);
    ASSERT_TRUE(drain.has_value());
    while (drain->ReadLine(20000)) {
    }
    ASSERT_EQ(drain->Wait(20000), 0) << drain->transcript();
    const auto drained_at = std::chrono::steady_clock::now();
    // The drained process exits by itself, with 0.
    absl::StatusOr<int> code = cluster().WaitExit(victim.first, victim.second, 60000);
    ASSERT_TRUE(code.ok()) << "the drained " << name << " never exited: " << code.status();
    EXPECT_EQ(*code, 0);
    std::printf("%s: drained, exited %lld ms after `connexctl drain`\n", name.c_str(),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - drained_at)
                                           .count()));
    streams.Wait();
    ExpectCorrect(outcomes);
    for (const auto& o : outcomes) EXPECT_EQ(o->result.finish_reason, "length") << o->spec.prompt;
    EXPECT_EQ(ProxyMetric("connex_request_failure_total"), 0.0);
    // The LID, free again, comes back as a new process.
    absl::Status restarted = cluster().Restart(victim.first, victim.second);
    ASSERT_TRUE(restarted.ok()) << restarted;
    ASSERT_TRUE(WaitUntil([&] { return ProxyReplicas() == 2; }, 20000));
  }
}

// A stage 0 at work is not a dead one. Behind a proxy whose idle timeout (600 ms) is shorter
// than the pipeline's own failover (a step timeout of 1 s, then a probe), a middle stage is
// stopped (SIGSTOP) under streams: stage 0 keeps its streams alive while its owner moves the
// steps to the other replica's stage, so the proxy resumes nothing and every response is exact.
// Without the keep-alive (CONNEX_STAGE_STREAM_KEEPALIVE_MS=0) the proxy takes each silent stage
// 0 for dead and resumes its streams elsewhere, recomputing them.
class ShortIdleProxyTest : public ServingE2eTest {
 protected:
  void Configure(chaos::ClusterOptions& o) override { o.proxy_idle_timeout_ms = 600; }
};

TEST_F(ShortIdleProxyTest, AFailoverBehindStageZeroIsNotTakenForADeadReplica) {
  constexpr int kTokens = 120;
  Streams streams;
  std::vector<std::shared_ptr<chaos::Outcome>> outcomes;
  for (int i = 0; i < 4; ++i) {
    std::optional<chaos::RequestSpec> spec = RunningFullLength(
        [&](int k) {
          return chaos::RequestSpec{
              .prompt = "keep alive " + std::to_string(i) + " " + std::to_string(k),
              .max_tokens = kTokens};
        },
        40);
    ASSERT_TRUE(spec.has_value());
    outcomes.push_back(streams.Start(*spec, proxy(), "proxy"));
  }
  ASSERT_TRUE(streams.WaitForTokens(2));
  // Stage 1 of a replica whose stage 0 has streams (a stage 0 routes through its own replica).
  int victim = -1;
  for (int r = 0; r < 2 && victim < 0; ++r) {
    if (MetricSum(http_port(r), "connex_stage_requests_in_flight") > 0) victim = r;
  }
  ASSERT_GE(victim, 0) << "no stage 0 has a stream in flight";
  const double failovers_before = StageZeroSum("connex_failovers_total");
  ASSERT_TRUE(cluster().Stop(1, victim).ok());
  streams.Wait();
  ExpectCorrect(outcomes);
  for (const auto& o : outcomes) EXPECT_EQ(o->result.finish_reason, "length") << o->spec.prompt;
  EXPECT_GT(StageZeroSum("connex_failovers_total"), failovers_before)
      << "no step went through the stopped stage";
  EXPECT_EQ(ProxyMetric("connex_proxy_resumes_total"), 0.0);
  EXPECT_EQ(ProxyMetric("connex_request_failure_total"), 0.0);
  ASSERT_TRUE(cluster().Resume(1, victim).ok());
}

}  // namespace
}  // namespace connex::testing
