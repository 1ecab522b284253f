// The serving stack end to end through a stage 0's API, with real processes on loopback (the
// fixture's deployment: two replica chains of a three-stage pipeline and the resume proxy, started
// with connex-chaos's Cluster). Completions (greedy and sampled, whole and streamed) must be
// exactly connex-generate's for the same prompt and seed (chaos::Check) — also when a stage is
// killed with SIGKILL while the response streams.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <utility>

#include "connex/base/subprocess.h"
#include "connex/base/wait.h"
#include "connex/directory/client.h"
#include "connex/serving/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/serving_e2e_fixture.h"

namespace connex::testing {
namespace {

using serving::testing::TestConnection;
using ::testing::HasSubstr;

TEST_F(ServingE2eTest, CompletionsCarryExactlyTheReferenceTokens) {
  const chaos::RequestSpec greedy{.prompt = "Endpoint mobility", .max_tokens = 24};
  auto [status, body] =
      Request(0, "POST", "/v1/completions",
              R"({"model": "tiny", "prompt": "Endpoint mobility", "max_tokens": 24})");
  ASSERT_EQ(status, 200) << body;
  nlohmann::json j = nlohmann::json::parse(body);
  EXPECT_EQ(j["usage"]["completion_tokens"], j["choices"][0]["token_ids"].size());
  ExpectCorrect({WholeOutcome(greedy, "replica 0", status, body)});

  // Sampled and streamed, on the other replica.
  const chaos::RequestSpec sampled{.prompt = "Endpoint mobility",
                                   .max_tokens = 24,
                                   .temperature = 0.9f,
                                   .top_p = 0.95f,
                                   .seed = 1234};
  Streams streams;
  std::shared_ptr<chaos::Outcome> streamed = streams.Start(sampled, api(1), "replica 1");
  streams.Wait();
  ExpectCorrect({streamed});
  EXPECT_NE(streamed->result.tokens, Want(greedy).tokens);  // sampling did choose
}

// The mission through the API: a middle stage of the chain serving a stream is killed with
// SIGKILL; the stream goes on through the other replica's stage with exactly the tokens of an
// undisturbed run; the killed stage restarted under its LID takes traffic again.
TEST_F(ServingE2eTest, AStageKilledMidStreamChangesNoToken) {
  for (int victim : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(victim));
    const std::string prompt = "kill stage " + std::to_string(victim);
    // A seed whose generation runs the whole length (no EOS), so that the kill lands mid-stream.
    std::optional<chaos::RequestSpec> spec = RunningFullLength(
        [&](int k) {
          return chaos::RequestSpec{.prompt = prompt,
                                    .max_tokens = 160,
                                    .temperature = 0.8f,
                                    .seed = static_cast<uint64_t>(7 + k)};
        },
        33);
    ASSERT_TRUE(spec.has_value());
    Streams streams;
    std::shared_ptr<chaos::Outcome> o = streams.Start(*spec, api(0), "replica 0");
    ASSERT_TRUE(streams.WaitForTokens(1));
    ASSERT_GE(o->live.Get().tokens, 1) << "the stream ended before its first token";
    ASSERT_TRUE(cluster().Kill(victim, 0).ok());
    streams.Wait();
    ExpectCorrect({o});
    EXPECT_EQ(o->result.finish_reason, "length");
    // The kill landed mid-stream: the owner moved steps to the other replica.
    std::smatch m;
    std::string metrics = Get(0, "/metrics").second;
    ASSERT_TRUE(std::regex_search(metrics, m, std::regex("connex_failovers_total ([0-9.e+]+)")))
        << metrics;
    EXPECT_GT(std::stod(m[1]), 0.0) << metrics;
    // The same LID comes back as a new process and serves again.
    absl::Status restarted = cluster().Restart(victim, 0);
    ASSERT_TRUE(restarted.ok()) << restarted;
  }
  auto [status, body] = Request(0, "POST", "/v1/completions",
                                R"({"model": "tiny", "prompt": "again", "max_tokens": 8})");
  ASSERT_EQ(status, 200) << body;
  ExpectCorrect({WholeOutcome({.prompt = "again", .max_tokens = 8}, "replica 0", status, body)});
}

// Stage 0 publishes its API's address with its record: what the resume proxy and connexctl read.
TEST_F(ServingE2eTest, StageZeroPublishesItsHttpAddressInTheDirectory) {
  auto snapshot = cluster().watcher().GetSnapshot(kModelName);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  std::map<uint32_t, std::string> http;
  for (const directory::Record& r : snapshot->records) {
    auto it = r.metadata.find("http");
    if (r.lid.group == 0) {
      ASSERT_NE(it, r.metadata.end()) << r.lid.ToString();
      http[r.lid.replica] = it->second;
    } else {
      EXPECT_EQ(it, r.metadata.end()) << r.lid.ToString();
    }
  }
  EXPECT_EQ(http[0], "127.0.0.1:" + std::to_string(http_port(0)));
  EXPECT_EQ(http[1], "127.0.0.1:" + std::to_string(http_port(1)));
}

TEST_F(ServingE2eTest, BadRequestsGetAClearErrorAndTheStageKeepsServing) {
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  for (const Case& k : std::vector<Case>{
           {"{not json", 400, ""},
           {R"({"model": "tiny", "prompt": "x", "max_tokens": "many"})", 400, "max_tokens"},
           {R"({"model": "tiny"})", 400, "prompt"},
           {R"({"model": "tiny", "prompt": "x", "temperature": 7})", 400, "temperature"},
           {R"({"model": "tiny", "prompt": "x", "n": 3})", 400, "n"},
           {R"({"model": "other", "prompt": "x"})", 404, "model"},
           {R"({"model": "tiny", "prompt": "x", "max_tokens": 100000})", 400, "max_tokens"},
       }) {
    auto [status, body] = Request(0, "POST", "/v1/completions", k.body);
    EXPECT_EQ(status, k.status) << k.body << " -> " << body;
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << body;
    if (!k.param.empty()) {
      EXPECT_EQ(j["error"]["param"], k.param) << body;
    }
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  auto [status, body] = Get(0, "/v1/models");
  EXPECT_EQ(status, 200);
  EXPECT_THAT(body, HasSubstr("\"tiny\""));
  // GET /v1/models/{id}: the object /v1/models lists, or OpenAI's 404.
  std::tie(status, body) = Get(0, "/v1/models/tiny");
  EXPECT_EQ(status, 200);
  nlohmann::json listed = nlohmann::json::parse(Get(0, "/v1/models").second)["data"][0];
  EXPECT_EQ(nlohmann::json::parse(body, nullptr, false), listed) << body;
  std::tie(status, body) = Get(0, "/v1/models/nope");
  EXPECT_EQ(status, 404);
  EXPECT_THAT(body, HasSubstr("\"model_not_found\""));
  // Bad values of vLLM's fields are refused naming the field and the value.
  for (const auto& [field, param] : std::vector<std::pair<std::string, std::string>>{
           {R"("min_p": 1.5)", "min_p"},
           {R"("repetition_penalty": 0)", "repetition_penalty"},
           {R"("stop_token_ids": [258])", "stop_token_ids"},
           {R"("ignore_eos": "yes")", "ignore_eos"}}) {
    std::tie(status, body) = Request(
        0, "POST", "/v1/chat/completions",
        R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], )" + field + "}");
    EXPECT_EQ(status, 400) << field << " -> " << body;
    EXPECT_EQ(nlohmann::json::parse(body, nullptr, false)["error"]["param"], param) << body;
  }
  std::tie(status, body) = Request(0, "POST", "/v1/completions",
                                   R"({"model": "tiny", "prompt": "ok", "max_tokens": 4})");
  EXPECT_EQ(status, 200) << body;
}

// A client that goes away mid-stream cancels its request: the owner stops generating it (and
// releases its state on every stage; the step protocol's tests check the release).
TEST_F(ServingE2eTest, AClientThatDisconnectsMidStreamCancelsItsRequest) {
  {
    TestConnection c(http_port(0), 60000);
    ASSERT_TRUE(c.Send("POST", "/v1/completions",
                       R"({"model": "tiny", "prompt": "a long one", "max_tokens": 4000,
                           "stream": true})"));
    ASSERT_TRUE(c.ReadHead());
    ASSERT_TRUE(c.ReadUntil("token_ids"));
    // While it streams, the stages do hold it (so the check below can fail).
    EXPECT_FALSE(HeldAnywhere().empty());
    c.Close();
  }
  EXPECT_TRUE(WaitUntil(
      [&] {
        std::string metrics = Get(0, "/metrics").second;
        return metrics.find("connex_requests_running 0") != std::string::npos;
      },
      20000))
      << Get(0, "/metrics").second;
  std::string metrics = Get(0, "/metrics").second;
  EXPECT_THAT(metrics, HasSubstr("connex_generation_tokens_total"));
  // ... and no stage holds its state any more.
  EXPECT_TRUE(WaitUntil([&] { return HeldAnywhere().empty(); }, 20000)) << HeldAnywhere();
}

// Every /metrics (stage 0, a later stage, the proxy) passes `promtool check metrics` (but for
// vLLM's own names, whose ':' promtool's lint flags) and carries vLLM's names for the serving
// metrics, with the model's name.
TEST_F(ServingE2eTest, MetricsAreLintCleanAndCarryVllmNames) {
  ASSERT_EQ(Request(0, "POST", "/v1/completions",
                    R"({"model": "tiny", "prompt": "count me", "max_tokens": 3})")
                .first,
            200);
  const bool promtool = std::filesystem::exists("/usr/bin/promtool");
  for (uint16_t port : {http_port(0), metrics_port(1, 0), proxy_port()}) {
    SCOPED_TRACE(port);
    TestConnection c(port, 60000);
    ASSERT_TRUE(c.Send("GET", "/metrics"));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    if (port != metrics_port(1, 0)) {
      EXPECT_THAT(r->body(), HasSubstr("vllm:num_requests_running{model_name=\"tiny\"}"));
      EXPECT_THAT(r->body(), HasSubstr("vllm:num_requests_waiting{model_name=\"tiny\"}"));
      EXPECT_THAT(r->body(), HasSubstr("vllm:time_to_first_token_seconds_bucket{model_name="));
    }
    if (!promtool) continue;
    // vLLM's names carry a ':' (promtool's lint flags that in every vLLM exposition): the
    // aliases keep them as dashboards read them; every name of Connex's own is lint-clean.
    std::istringstream lines(r->body());
    std::string own, line;
    while (std::getline(lines, line)) {
      if (line.find("vllm:") == std::string::npos) own += line + "\n";
    }
    const std::string file = work_dir() + "/metrics-" + std::to_string(port) + ".txt";
    std::ofstream(file) << own;
    auto check =
        Subprocess::Start({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + file}, {}, true);
    ASSERT_TRUE(check.has_value());
    while (check->ReadLine(30000)) {
    }
    EXPECT_EQ(check->Wait(30000), 0) << check->transcript();
  }
  if (!promtool) GTEST_SKIP() << "promtool (Debian's prometheus) is not installed";
}

// connexctl shows the deployment: chains, each stage's epoch, stage 0's API and its health; a
// killed stage shows as missing once its lease runs out.
TEST_F(ServingE2eTest, ConnexctlShowsTheServingDeployment) {
  auto serving = [&]() -> nlohmann::json {
    auto p = Subprocess::Start({BinDir() + "/connexctl", "--directory", cluster().directory(),
                                "serving", "--model", kModelName, "--json"});
    EXPECT_TRUE(p.has_value());
    auto line = p->WaitForLine("[", 20000);
    EXPECT_TRUE(line.has_value()) << p->transcript();
    EXPECT_EQ(p->Wait(20000), 0) << p->transcript();
    return line ? nlohmann::json::parse(*line) : nlohmann::json::array();
  };
  nlohmann::json view = serving();
  ASSERT_EQ(view.size(), 1u) << view.dump();
  EXPECT_EQ(view[0]["model"], kModelName);
  EXPECT_EQ(view[0]["stages"], kStages);
  EXPECT_EQ(view[0]["ready"], true);
  ASSERT_EQ(view[0]["replicas"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const nlohmann::json& replica = view[0]["replicas"][r];
    EXPECT_EQ(replica["http"], "127.0.0.1:" + std::to_string(http_port(r)));
    EXPECT_EQ(replica["health"]["status"], 200) << replica.dump();
    for (int s = 0; s < kStages; ++s) EXPECT_FALSE(replica["stages"][s].is_null());
  }
  ASSERT_TRUE(cluster().Kill(2, 0).ok());
  EXPECT_TRUE(WaitUntil([&] { return serving()[0]["replicas"][0]["stages"][2].is_null(); }, 20000));
  view = serving();
  EXPECT_EQ(view[0]["ready"], true) << "replica 1's stage 2 serves both chains";
  auto table =
      Subprocess::Start({BinDir() + "/connexctl", "--directory", cluster().directory(), "serving"});
  ASSERT_TRUE(table.has_value());
  auto head = table->WaitForLine("model tiny", 20000);
  ASSERT_TRUE(head.has_value()) << table->transcript();
  EXPECT_THAT(*head, HasSubstr("3 stages, 2 replicas, ready"));
  EXPECT_EQ(table->Wait(20000), 0);
  EXPECT_THAT(table->transcript(), HasSubstr("missing"));
}

// A model directory's generation_config.json gives a request that omits its sampling fields the
// model's defaults (--generation-config auto, vLLM's rule), on stage 0 and through the proxy (which
// forwards only the fields a client gave), as connex-generate applies them; with
// CONNEX_GENERATION_CONFIG=none such a request is greedy.
TEST(GenerationConfigE2eTest, ARequestWithoutSamplingFieldsTakesTheModelsDefaults) {
  const std::string dir =
      ::testing::TempDir() + "/serving-e2e-generation-" + std::to_string(::getpid());
  const std::string model = dir + "/qwen";
  std::filesystem::create_directories(dir);
  // Qwen 2.5's published defaults (connex-mkmodel's preset): temperature 0.7, top_p 0.8, top_k 20,
  // repetition_penalty 1.1.
  auto mk = Subprocess::Start(
      {BinDir() + "/connex-mkmodel", "--hf", model, "--config", "qwen2.5-0.5b", "--layers", "2",
       "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "96"},
      {}, /*capture_stderr=*/true);
  ASSERT_TRUE(mk.has_value());
  ASSERT_EQ(mk->Wait(120'000), 0) << mk->transcript();
  const std::string prompt = "151643,17,33,400,5";
  auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {BinDir() + "/connex-generate",
                                     "--model",
                                     model,
                                     "--prompt-tokens",
                                     prompt,
                                     "--max-tokens",
                                     "16",
                                     "--ignore-eos",
                                     "--json"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto g = Subprocess::Start(argv, {}, /*capture_stderr=*/true);
    EXPECT_TRUE(g.has_value());
    if (!g) return std::vector<int32_t>{};
    std::optional<std::string> line = g->WaitForLine("\"tokens\"", 60'000);
    EXPECT_EQ(g->Wait(60'000), 0) << g->transcript();
    if (!line) return std::vector<int32_t>{};
    return nlohmann::json::parse(*line)["tokens"].get<std::vector<int32_t>>();
  };
  const std::vector<int32_t> sampled = generate({"--seed", "5"});
  const std::vector<int32_t> greedy = generate({"--seed", "5", "--generation-config", "none"});
  ASSERT_EQ(sampled.size(), 16u);
  EXPECT_NE(sampled, greedy) << "the defaults sample";
  EXPECT_EQ(generate({"--seed", "5", "--generation-config", "none", "--temperature", "0.7",
                      "--top-p", "0.8", "--top-k", "20", "--repetition-penalty", "1.1"}),
            sampled);
  EXPECT_EQ(generate({"--seed", "5", "--temperature", "0"}), greedy) << "a flag given wins";

  const std::string body = R"({"model": "qwen", "prompt": [151643, 17, 33, 400, 5],
      "max_tokens": 16, "ignore_eos": true, "seed": 5})";
  for (const std::string mode : {"auto", "none"}) {
    SCOPED_TRACE("--generation-config " + mode);
    const std::string work = dir + "/" + mode;
    std::filesystem::create_directories(work);
    chaos::ClusterOptions o;
    o.bin_dir = BinDir();
    o.work_dir = work;
    o.model_path = model;
    o.model_name = "qwen";
    o.replicas = 1;
    o.stages = 2;
    o.backend = "auto";
    o.proxy_idle_timeout_ms = 0;
    o.stage_env = {"CONNEX_GENERATION_CONFIG=" + mode};
    absl::StatusOr<std::unique_ptr<chaos::Cluster>> cluster = chaos::Cluster::Start(std::move(o));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    for (const uint16_t port : {(*cluster)->api(0).port, (*cluster)->proxy()->port}) {
      TestConnection c(port, 60'000);
      ASSERT_TRUE(c.Send("POST", "/v1/completions", body));
      auto r = c.Read();
      ASSERT_TRUE(r.has_value());
      ASSERT_EQ(r->result_int(), 200) << r->body();
      const nlohmann::json j = nlohmann::json::parse(r->body());
      EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
                mode == "auto" ? sampled : greedy)
          << (port == (*cluster)->api(0).port ? "stage 0" : "the proxy");
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace connex::testing
