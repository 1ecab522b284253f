// bench_handover: how long a request stalls when a pipeline stage is killed mid-generation.
//
// Each run starts a real deployment — `connex-directory`, stages 1..N-1 of two replica chains
// and the stage-0 owner of replica 0 (`pp_test_node`, reference Llama engine, one process per
// stage, `--stream`) — lets every request generate `--warmup-tokens` tokens, SIGKILLs stage
// `--kill-stage` of replica 0, and reads the owner's token stream to the end. Per request it
// reports the time from the kill to its next token (the handover: peer-death event, re-send to
// the other replica, re-prefill there, and the step itself) against the steady-state time
// between tokens, and checks every request's tokens against an undisturbed single-process run.
// A program that prints figures; not a test.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "connex/base/cli.h"
#include "connex/base/stats.h"
#include "connex/base/subprocess.h"
#include "connex/engine/generator.h"
#include "connex/engine/pipeline.h"
#include "nlohmann/json.hpp"
#include "tests/pp_prompts.h"

namespace {

using connex::BinDir;
using connex::Percentile;
using connex::Subprocess;
using connex::testing::PromptOf;

struct Config {
  std::string backend = "tcp";
  int runs = 5;
  int stages = 3;
  int kill_stage = 1;
  int requests = 4;
  int max_new = 160;
  int warmup_tokens = 30;
  int inflight = 0;                // 0: the node's default (CONNEX_PP_INFLIGHT)
  std::string kv_standby = "off";  // CONNEX_PP_KV_STANDBY of every stage
  int64_t prompt_tokens = 0;       // 0: PromptOf(id), a few tokens
  std::string model_path;
  std::string log_level = "warn";  // of the stage processes
  bool json = false;
};

struct RequestTrace {
  std::vector<int64_t> times_us;  // one per streamed token
  std::vector<int32_t> tokens;    // the final answer
  std::string error;
};

struct RunResult {
  bool ok = false;
  std::string problem;
  std::vector<double> handover_ms;  // per request that was still running at the kill
  std::vector<double> gap_ms;       // steady-state gaps between tokens before the kill
  int exact = 0, total = 0;
  std::string done_line;
};

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::optional<Subprocess> StartNode(const Config& c, const std::string& bind, int stage,
                                    int replica, std::vector<std::string> extra) {
  std::vector<std::string> argv = {BinDir() + "/pp_test_node",
                                   "--directory",
                                   bind,
                                   "--backend",
                                   c.backend,
                                   "--model",
                                   "handover",
                                   "--stage",
                                   std::to_string(stage),
                                   "--stages",
                                   std::to_string(c.stages),
                                   "--replica",
                                   std::to_string(replica),
                                   "--engine",
                                   "llama",
                                   "--model-path",
                                   c.model_path};
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::vector<std::string> env = {"CONNEX_LOG_LEVEL=" + c.log_level, "CONNEX_ENGINE_THREADS=1"};
  if (c.inflight > 0) env.push_back("CONNEX_PP_INFLIGHT=" + std::to_string(c.inflight));
  env.push_back("CONNEX_PP_KV_STANDBY=" + c.kv_standby);
  // A step that prefills (or re-prefills) long prompts runs for seconds on this engine: the step
  // timeout must not take a busy stage for a silent one (a kill is seen at once, by peer death).
  const int64_t step_timeout_ms = std::max<int64_t>(1000, 8 * c.prompt_tokens * c.requests);
  env.push_back("CONNEX_PP_STEP_TIMEOUT_MS=" + std::to_string(step_timeout_ms));
  auto p = Subprocess::Start(argv, env);
  if (!p || !p->WaitForLine("ready ", 30000)) return std::nullopt;
  return p;
}

RunResult RunOnce(const Config& c, connex::engine::Pipeline& reference) {
  RunResult out;
  auto directory = Subprocess::Start({BinDir() + "/connex-directory", "--bind", "tcp://127.0.0.1:0",
                                      "--pub", "tcp://127.0.0.1:0"});
  std::optional<std::string> line = directory ? directory->ReadLine(10000) : std::nullopt;
  std::smatch m;
  if (!line || !std::regex_search(*line, m, std::regex("bind=(tcp://[0-9.:]+)"))) {
    out.problem = "connex-directory did not start";
    return out;
  }
  std::string bind = m[1];
  std::map<std::pair<int, int>, Subprocess> nodes;
  for (int r = 0; r < 2; ++r) {
    for (int s = 1; s < c.stages; ++s) {
      auto p = StartNode(c, bind, s, r, {});
      if (!p) {
        out.problem =
            "stage " + std::to_string(s) + " of replica " + std::to_string(r) + " did not start";
        return out;
      }
      nodes.emplace(std::make_pair(s, r), std::move(*p));
    }
  }
  auto owner = StartNode(
      c, bind, 0, 0,
      {"--requests", std::to_string(c.requests), "--max-new-tokens", std::to_string(c.max_new),
       "--prompt-tokens", std::to_string(c.prompt_tokens), "--stream"});
  if (!owner) {
    out.problem = "the owner did not start";
    return out;
  }

  std::map<uint64_t, RequestTrace> traces;
  int64_t kill_us = 0;
  int finished = 0;
  int64_t deadline = NowUs() + 300'000'000;
  while (NowUs() < deadline) {
    std::optional<std::string> l = owner->ReadLine(1000);
    if (!l) {
      if (owner->Wait(0).has_value()) break;
      continue;
    }
    if (l->rfind("done", 0) == 0) {
      out.done_line = *l;
      break;
    }
    if (l->empty() || (*l)[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(*l, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("id")) continue;
    RequestTrace& t = traces[j["id"].get<uint64_t>()];
    if (j.contains("token")) {
      t.times_us.push_back(j["t_us"].get<int64_t>());
    } else {
      if (j.contains("tokens")) t.tokens = j["tokens"].get<std::vector<int32_t>>();
      if (j.contains("error")) t.error = j["error"].get<std::string>();
      ++finished;
    }
    if (kill_us == 0 && static_cast<int>(traces.size()) == c.requests &&
        std::all_of(traces.begin(), traces.end(), [&](const auto& kv) {
          return static_cast<int>(kv.second.times_us.size()) >= c.warmup_tokens;
        })) {
      kill_us = NowUs();
      nodes.at({c.kill_stage, 0}).Signal(SIGKILL);
    }
  }
  if (kill_us == 0 || finished != c.requests) {
    out.problem = kill_us == 0 ? "the requests ended before the kill (raise --max-new-tokens)"
                               : "not every request finished: " + owner->transcript();
    return out;
  }
  for (auto& [id, t] : traces) {
    ++out.total;
    connex::engine::GenerateOptions options;
    options.max_tokens = c.max_new;
    options.stop_at_eos = false;
    auto want =
        connex::engine::Generate(reference, {PromptOf(id, c.prompt_tokens)}, options, 1000 + id);
    if (t.error.empty() && want.ok() && (*want)[0].tokens == t.tokens) ++out.exact;
    auto after = std::upper_bound(t.times_us.begin(), t.times_us.end(), kill_us);
    if (after != t.times_us.end()) {
      out.handover_ms.push_back(static_cast<double>(*after - kill_us) / 1000.0);
    }
    for (auto it = t.times_us.begin() + 1; it < after; ++it) {
      out.gap_ms.push_back(static_cast<double>(*it - *(it - 1)) / 1000.0);
    }
  }
  out.ok = true;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  connex::cli::App app{"bench_handover: kill a pipeline stage mid-generation, time the handover"};
  Config c;
  app.add_option("--backend", c.backend, "data plane between stages: tcp, shm, ucx, auto")
      ->check(connex::cli::IsMember({"tcp", "shm", "ucx", "auto"}))
      ->capture_default_str();
  app.add_option("--runs", c.runs, "deployments to start and kill a stage in")
      ->check(connex::cli::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--stages", c.stages, "pipeline stages per replica chain (>= 2)")
      ->check(connex::cli::Range(2, 64))
      ->capture_default_str();
  app.add_option("--kill-stage", c.kill_stage, "the stage of replica 0 to SIGKILL (>= 1)")
      ->check(connex::cli::Range(1, 63))
      ->capture_default_str();
  app.add_option("--requests", c.requests, "requests the owner generates together")
      ->check(connex::cli::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--max-new-tokens", c.max_new, "tokens per request")
      ->check(connex::cli::Range(3, 1 << 20))
      ->capture_default_str();
  app.add_option("--warmup-tokens", c.warmup_tokens, "tokens every request has before the kill")
      ->check(connex::cli::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--inflight", c.inflight, "steps in flight per route (0: CONNEX_PP_INFLIGHT)")
      ->check(connex::cli::Range(0, 1024))  // as CONNEX_PP_INFLIGHT, 0 for "unset"
      ->capture_default_str();
  app.add_option("--model-path", c.model_path,
                 "checkpoint (default: connex-mkmodel's default model, written to a temp dir)");
  app.add_option("--kv-standby", c.kv_standby,
                 "on: every stage mirrors its KV state to the same stage of the other replica, "
                 "which takes the killed stage's requests over without a re-prefill")
      ->check(connex::cli::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--prompt-tokens", c.prompt_tokens,
                 "tokens of every prompt (0: a few); the context a re-prefill recomputes")
      ->check(connex::cli::Range(int64_t{0}, int64_t{1} << 16))
      ->capture_default_str();
  app.add_flag("--json", c.json, "print one JSON object");
  // This process and the stages log at the level given (flag or CONNEX_LOG_LEVEL), else at warn.
  connex::cli::Option* log_level = connex::AddLogLevelFlag(app, "warn");
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv, [&] {
        if (c.kill_stage >= c.stages || c.max_new <= c.warmup_tokens) {
          throw connex::cli::ValidationError(
              "--kill-stage, --max-new-tokens",
              "need 1 <= --kill-stage < --stages and --max-new-tokens > --warmup-tokens");
        }
      })) {
    return *code;
  }
  c.log_level = log_level->as<std::string>();
  std::string tmp;
  if (c.model_path.empty()) {
    tmp = (std::filesystem::temp_directory_path() / ("bench-handover-" + std::to_string(getpid())))
              .string();
    std::filesystem::create_directories(tmp);
    c.model_path = tmp + "/model.safetensors";
    auto mk = Subprocess::Start({BinDir() + "/connex-mkmodel", "--out", c.model_path}, {}, true);
    while (mk && mk->ReadLine(60000)) {
    }
    if (!mk || mk->Wait(60000) != 0) {
      std::fprintf(stderr, "bench_handover: connex-mkmodel failed\n");
      return 1;
    }
  }
  auto reference = connex::engine::Pipeline::Load(c.model_path, c.stages);
  if (!reference.ok()) {
    std::fprintf(stderr, "bench_handover: %s\n", std::string(reference.status().message()).c_str());
    return 1;
  }

  std::vector<double> handover, gaps;
  int exact = 0, total = 0, failed_runs = 0;
  nlohmann::json runs = nlohmann::json::array();
  for (int run = 1; run <= c.runs; ++run) {
    RunResult r = RunOnce(c, **reference);
    if (!r.ok) {
      ++failed_runs;
      std::fprintf(stderr, "run %d: %s\n", run, r.problem.c_str());
      continue;
    }
    handover.insert(handover.end(), r.handover_ms.begin(), r.handover_ms.end());
    gaps.insert(gaps.end(), r.gap_ms.begin(), r.gap_ms.end());
    exact += r.exact;
    total += r.total;
    runs.push_back({{"run", run},
                    {"handover_ms", r.handover_ms},
                    {"token_gap_p50_ms", Percentile(r.gap_ms, 0.5)},
                    {"exact", r.exact},
                    {"requests", r.total},
                    {"owner", r.done_line}});
    if (!c.json) {
      std::printf("run %d: handover ms", run);
      for (double h : r.handover_ms) std::printf(" %.1f", h);
      std::printf("  | steady gap p50 %.2f ms | exact %d/%d | %s\n", Percentile(r.gap_ms, 0.5),
                  r.exact, r.total, r.done_line.c_str());
      std::fflush(stdout);
    }
  }
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  nlohmann::json summary = {{"backend", c.backend},
                            {"kv_standby", c.kv_standby},
                            {"prompt_tokens", c.prompt_tokens},
                            {"stages", c.stages},
                            {"kill_stage", c.kill_stage},
                            {"requests", c.requests},
                            {"inflight", c.inflight},
                            {"runs", c.runs},
                            {"failed_runs", failed_runs},
                            {"handover_p50_ms", Percentile(handover, 0.5)},
                            {"handover_p90_ms", Percentile(handover, 0.9)},
                            {"handover_p99_ms", Percentile(handover, 0.99)},
                            {"handover_max_ms", Percentile(handover, 1.0)},
                            {"token_gap_p50_ms", Percentile(gaps, 0.5)},
                            {"token_gap_p99_ms", Percentile(gaps, 0.99)},
                            {"exact", exact},
                            {"total", total}};
  if (c.json) {
    summary["per_run"] = runs;
    std::printf("%s\n", summary.dump().c_str());
  } else {
    std::printf(
        "%s, kv standby %s, %d stages, kill stage %d, %d requests, prompts of %lld tokens: "
        "handover p50 %.1f / p90 %.1f / p99 %.1f / max %.1f ms; "
        "steady token gap p50 %.2f / p99 %.2f ms; exact %d/%d; failed runs %d\n",
        c.backend.c_str(), c.kv_standby.c_str(), c.stages, c.kill_stage, c.requests,
        static_cast<long long>(c.prompt_tokens), Percentile(handover, 0.5),
        Percentile(handover, 0.9), Percentile(handover, 0.99), Percentile(handover, 1.0),
        Percentile(gaps, 0.5), Percentile(gaps, 0.99), exact, total, failed_runs);
  }
  return failed_runs == 0 && exact == total ? 0 : 1;
}
