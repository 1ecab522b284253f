// pp_test_node: one pipeline stage as its own process, for the multi-process step-protocol
// tests: a StageNode with the deterministic TestEngine over a real transport (tcp, shm, ucx) and
// ZeroMQ signals. Stage 0 also submits --requests requests and prints one JSON line per finished
// request, then `done`. Every node prints `ready LID epoch=E` once it has joined. SIGTERM leaves
// gracefully; SIGKILL is what the tests use to kill it.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include "absl/strings/numbers.h"
#include "connex/base/cli.h"
#include "connex/base/logging.h"
#include "connex/base/signals.h"
#include "connex/directory/client.h"
#include "connex/directory/etcd/etcd_backend.h"
#include "connex/engine/stage_engine.h"
#include "connex/pp/node.h"
#include "connex/pp/testing/test_engine.h"
#include "nlohmann/json.hpp"
#include "tests/pp_prompts.h"

using connex::testing::PromptOf;

int main(int argc, char** argv) {
  connex::directory::RegisterEtcdBackend();  // etcd:// addresses too
  connex::cli::App app{"pp_test_node: a step-protocol stage with the test engine"};
  std::string directory = "tcp://127.0.0.1:7000";
  std::string model = "pp";
  std::string backend = "tcp";
  uint32_t stage = 0, stages = 3, replica = 0;
  int requests = 0, max_new = 50;
  uint64_t first_id = 1;
  app.add_option("--directory", directory, "the directory's request endpoint")
      ->envname("CONNEX_DIRECTORY")
      ->capture_default_str();
  app.add_option("--model", model, "model name of the LID")
      ->check([](const std::string& m) {
        absl::Status ok = connex::Lid::ValidateModel(m);
        return ok.ok() ? std::string() : std::string(ok.message());
      })
      ->capture_default_str();
  app.add_option("--backend", backend, "tcp, shm, ucx, mem or auto")
      ->envname("CONNEX_PP_BACKEND")
      ->check(connex::cli::IsMember({"auto", "mem", "tcp", "shm", "ucx"}))
      ->capture_default_str();
  app.add_option("--stage", stage, "this node's stage, < --stages")
      ->check(connex::cli::Range(0u, 1023u))
      ->capture_default_str();
  app.add_option("--stages", stages, "stages of the pipeline (1 .. 1024)")
      ->check([](const std::string& text) -> std::string {
        uint32_t n = 0;
        if (absl::SimpleAtoi(text, &n) && n >= 1 && n <= 1024) return "";
        return "stages must be at least 1 and at most 1024, not " + text;
      })
      ->capture_default_str();
  app.add_option("--replica", replica, "replica chain")->capture_default_str();
  app.add_option("--requests", requests, "stage 0: requests to submit")
      ->check(connex::cli::Range(0, 1'000'000))
      ->capture_default_str();
  app.add_option("--max-new-tokens", max_new, "stage 0: tokens per request")
      ->check(connex::cli::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--first-id", first_id, "stage 0: id of the first request")
      ->check(connex::cli::Range(uint64_t{1}, uint64_t{1} << 62))
      ->capture_default_str();
  std::string engine_name = "test";
  std::string model_path;
  app.add_option("--engine", engine_name, "test (the deterministic test engine) or llama")
      ->check(connex::cli::IsMember({"test", "llama"}))
      ->capture_default_str();
  app.add_option("--model-path", model_path, "llama: the checkpoint");
  bool stream = false;
  app.add_flag("--stream", stream,
               "stage 0: print every generated token as a JSON line with its time "
               "(steady clock, microseconds; the same clock in every process of this host)");
  bool sampled = false;
  app.add_flag("--sampled", sampled,
               "stage 0: odd request ids sample (tests/pp_prompts.h SamplingOf), even ones greedy");
  int64_t prompt_tokens = 0;
  app.add_option("--prompt-tokens", prompt_tokens,
                 "stage 0: prompts of this many tokens (0: a few, PromptOf)")
      ->check(connex::cli::Range(int64_t{0}, int64_t{1} << 20));
  bool report_epochs = false;
  app.add_flag("--report-epochs", report_epochs,
               "print `epochs current=E E1:STEPS:LAST_NS ...` whenever the steps run per epoch "
               "change (the last step's admission, CLOCK_MONOTONIC ns)");
  connex::AddLogLevelFlag(app);
  connex::AddInsecureFlag(app);
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv, [&] {
        if (stage >= stages) {
          throw connex::cli::ValidationError("--stage", "stage " + std::to_string(stage) +
                                                            " is outside a pipeline of " +
                                                            std::to_string(stages) + " stages");
        }
      })) {
    return *code;
  }
  const connex::TerminationSignals signals;

  // Bad flags or settings (InvalidArgument) exit 2, like a usage error; anything else 1.
  auto fail = [](const absl::Status& s) {
    std::cerr << "pp_test_node: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? connex::kUsageExitCode : 1;
  };
  // Every setting a directory client honours (token, admin token, timeouts) from the
  // environment, as for every other client; the flag names the directory.
  auto dopts = connex::directory::DirectoryClientOptions::FromEnv();
  if (!dopts.ok()) return fail(dopts.status());
  dopts->directory = directory;
  auto client = connex::directory::DirectoryClient::Connect(*dopts);
  if (!client.ok()) return fail(client.status());
  connex::Lid lid{model, stage, 0, replica};
  auto topts = connex::transport::TransportOptions::FromEnv(lid);
  if (!topts.ok()) return fail(topts.status());
  auto parsed = connex::transport::ParseBackend(backend);
  if (!parsed.ok()) return fail(parsed.status());
  topts->backend = *parsed;
  auto transfer = connex::transport::CreateTransferEngine(*topts);
  if (!transfer.ok()) return fail(transfer.status());
  auto sig = connex::pp::CreateZmqSignalTransport("127.0.0.1", dopts->curve);
  if (!sig.ok()) return fail(sig.status());
  connex::pp::StageNodeOptions base;
  base.model = model;
  base.stage = stage;
  base.stages = stages;
  base.replica = replica;
  base.step_timeout_ms = 1000;
  base.probe_timeout_ms = 300;
  auto options = connex::pp::StageNodeOptions::FromEnv(base);
  if (!options.ok()) return fail(options.status());
  std::unique_ptr<connex::pp::Engine> engine;
  if (engine_name == "test") {
    engine = std::make_unique<connex::pp::testing::TestEngine>(stage, stages);
  } else if (engine_name == "llama") {
    connex::engine::StageOptions so;
    so.stage = static_cast<int>(stage);
    so.stages = static_cast<int>(stages);
    auto loaded = connex::engine::StageEngine::Load(model_path, so);
    if (!loaded.ok()) return fail(loaded.status());
    engine = *std::move(loaded);
  } else {
    return fail(absl::InvalidArgumentError("--engine must be test or llama"));
  }
  auto node = connex::pp::StageNode::Start(*options, *engine, *std::move(transfer), *std::move(sig),
                                           **client);
  if (!node.ok()) return fail(node.status());
  std::printf("ready %s epoch=%llu\n", lid.ToString().c_str(),
              static_cast<unsigned long long>((*node)->epoch()));
  std::fflush(stdout);

  std::atomic<int> finished{0};
  if (stage == 0 && requests > 0) {
    // Wait until the directory shows every stage before submitting.
    for (uint32_t g = 1; g < stages; ++g) {
      (*client)->AwaitView(
          model,
          [g](const auto& v) {
            for (const auto& r : v)
              if (r.lid.group == g) return true;
            return false;
          },
          10000);
    }
    for (int i = 0; i < requests; ++i) {
      uint64_t id = first_id + static_cast<uint64_t>(i);
      connex::pp::SubmitOptions submit;
      if (sampled) submit.sampling = connex::testing::SamplingOf(id);
      if (stream) {
        submit.on_token = [](uint64_t rid, int32_t token) {
          int64_t t_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
          std::printf("{\"id\":%llu,\"token\":%d,\"t_us\":%lld}\n",
                      static_cast<unsigned long long>(rid), token, static_cast<long long>(t_us));
          std::fflush(stdout);
        };
      }
      absl::Status s = (*node)->Submit(
          id, PromptOf(id, prompt_tokens), max_new,
          [&finished](uint64_t rid, absl::StatusOr<std::vector<int32_t>> r) {
            nlohmann::json line = {{"id", rid}};
            if (r.ok()) {
              line["tokens"] = *r;
            } else {
              line["error"] = std::string(r.status().message());
            }
            std::printf("%s\n", line.dump().c_str());
            std::fflush(stdout);
            finished.fetch_add(1);
          },
          std::move(submit));
      if (!s.ok()) return fail(s);
    }
  }
  int64_t last_progress = 0;
  std::string last_epochs;
  while (true) {
    int sig_no = signals.WaitFor(20);
    if (sig_no > 0) {
      (*node)->Stop(/*leave=*/true);
      return 0;
    }
    if (report_epochs) {
      auto stats = (*node)->stats();
      std::string line = "epochs current=" + std::to_string(stats.epoch);
      for (const auto& e : stats.epochs) {
        line += " " + std::to_string(e.epoch) + ":" + std::to_string(e.steps_executed) + ":" +
                std::to_string(e.last_step_monotonic_ns);
      }
      if (line != last_epochs) {
        last_epochs = line;
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      }
    }
    if (stage == 0 && requests > 0) {
      auto stats = (*node)->stats();
      if (static_cast<int64_t>(stats.steps_executed) / 50 > last_progress) {
        last_progress = static_cast<int64_t>(stats.steps_executed) / 50;
        std::printf("progress steps=%llu\n", static_cast<unsigned long long>(stats.steps_executed));
        std::fflush(stdout);
      }
      if (finished.load() == requests) {
        auto s = (*node)->stats();
        std::printf("done failovers=%llu reprefills=%llu resends=%llu lag_recomputes=%llu\n",
                    static_cast<unsigned long long>(s.failovers),
                    static_cast<unsigned long long>(s.reprefills),
                    static_cast<unsigned long long>(s.resends),
                    static_cast<unsigned long long>(s.lag_recomputes));
        std::fflush(stdout);
        (*node)->Stop(/*leave=*/true);
        return 0;
      }
    }
  }
}
