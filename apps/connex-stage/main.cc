// connex-stage: one pipeline stage of a served model as its own process (serving::StageProcess).
// It loads its layer slice, registers (model, stage, 0, replica) in the directory, serves steps,
// and prints `ready LID epoch=E` once it has joined. Stage 0 with --http also serves the
// OpenAI-compatible API (serving::OpenAiServer) and prints `listening http=HOST:PORT`. SIGTERM or
// SIGINT leaves gracefully (LEFT, in-flight steps finish); SIGKILL is a crash the others ride out.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "connex/base/cli.h"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/signals.h"
#include "connex/serving/listen_address.h"
#include "connex/serving/node_metrics.h"
#include "connex/serving/openai_server.h"
#include "connex/serving/stage.h"

int main(int argc, char** argv) {
  connex::serving::StageProcessOptions options;
  connex::cli::App app{"connex-stage: one pipeline stage of a served model"};
  app.add_option("--directory", options.directory, "the directory's request endpoint")
      ->envname("CONNEX_DIRECTORY")
      ->capture_default_str();
  app.add_option("--model", options.model_path,
                 "checkpoint: a .safetensors file, or a Hugging Face model directory (config.json "
                 "with model.safetensors or shards and their index)")
      ->envname("CONNEX_MODEL")
      ->required();
  app.add_option("--model-name", options.model_name,
                 "the served model's name (the LIDs' model); default: the checkpoint's name")
      ->envname("CONNEX_MODEL_NAME");
  app.add_option("--stage", options.stage, "this process's pipeline stage")
      ->envname("CONNEX_STAGE")
      ->check(connex::cli::Range(0u, 1023u))
      ->required();
  app.add_option("--stages", options.stages, "stages of the pipeline")
      ->envname("CONNEX_STAGES")
      ->check(connex::cli::Range(1u, 1024u))
      ->required();
  app.add_option("--replica", options.replica, "replica chain")
      ->envname("CONNEX_REPLICA")
      ->check(connex::cli::Range(0u, 1u << 20))
      ->capture_default_str();
  app.add_option("--backend", options.backend, "data plane: auto, tcp, shm or ucx")
      ->envname("CONNEX_PP_BACKEND")
      ->check(connex::cli::IsMember({"auto", "tcp", "shm", "ucx"}))
      ->capture_default_str();
  app.add_option("--signal-host", options.signal_host, "interface the signal socket binds")
      ->envname("CONNEX_SIGNAL_HOST")
      ->capture_default_str();
  app.add_option("--threads", options.threads, "kernel threads (0: CONNEX_ENGINE_THREADS or all)")
      ->check(connex::cli::Range(0, 256))
      ->capture_default_str();
  std::string http;
  app.add_option("--http", http,
                 "stage 0: serve the OpenAI-compatible API at HOST:PORT (port 0: a free one)")
      ->envname("CONNEX_HTTP");
  std::string metrics;
  app.add_option("--metrics", metrics,
                 "serve this stage's GET /metrics and /health at HOST:PORT (port 0: a free one)")
      ->envname("CONNEX_METRICS_LISTEN");
  int64_t default_max_tokens = 16;
  app.add_option("--default-max-tokens", default_max_tokens,
                 "max_tokens of a request that gives none")
      ->envname("CONNEX_DEFAULT_MAX_TOKENS")
      ->check(connex::cli::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  std::string kv_budget = "1G";
  app.add_option("--kv-budget", kv_budget,
                 "stage 0: KV cache (bytes, 4K/1M/1G) each stage may hold for the requests "
                 "admitted here; past it requests wait in the queue, then get 429")
      ->envname("CONNEX_STAGE_KV_BUDGET_BYTES")
      ->check(connex::SizeRange(uint64_t{1} << 20, uint64_t{1} << 44))
      ->capture_default_str();
  int64_t queue_max = 64;
  app.add_option("--queue-max", queue_max,
                 "stage 0: requests that may wait for KV budget; past it a request gets 429")
      ->envname("CONNEX_STAGE_QUEUE_MAX")
      ->check(connex::cli::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  int64_t stream_keepalive_ms = 250;
  app.add_option("--stream-keepalive-ms", stream_keepalive_ms,
                 "stage 0: a stream silent this long gets an SSE comment while the stage works "
                 "on it, so that connex-proxy's idle timeout (keep it several times this) takes "
                 "only a hung stage 0 as dead; 0: none")
      ->envname("CONNEX_STAGE_STREAM_KEEPALIVE_MS")
      ->check(connex::cli::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  std::string chat_template;
  app.add_option("--chat-template", chat_template,
                 "stage 0: the chat template of /v1/chat/completions (a Jinja file, or a .json "
                 "with a chat_template field); default: the model's tokenizer_config.json")
      ->envname("CONNEX_CHAT_TEMPLATE")
      ->check(connex::cli::ExistingFile);
  std::string generation_config = "auto";
  app.add_option("--generation-config", generation_config,
                 "stage 0: auto: a request that omits temperature, top_p, top_k, min_p or "
                 "repetition_penalty gets the model's generation_config.json value (as vLLM); "
                 "none: the built-in defaults (greedy)")
      ->envname("CONNEX_GENERATION_CONFIG")
      ->check(connex::cli::IsMember({"auto", "none"}))
      ->capture_default_str();
  std::string kv_standby;
  app.add_option("--kv-standby", kv_standby,
                 "on: mirror this stage's KV state to the same stage of the next replica, which "
                 "takes its requests over without a re-prefill if it dies; default: "
                 "CONNEX_PP_KV_STANDBY, else off")
      ->check(connex::cli::IsMember({"on", "off"}));
  std::string pd_role = "none";
  app.add_option("--pd-role", pd_role,
                 "prefill-decode disaggregation: frontend (--stage 0 --stages 2: the API and the "
                 "embedding), prefill or decode (--stage 1 --stages 2: every layer), or none")
      ->envname("CONNEX_PD_ROLE")
      ->check(connex::cli::IsMember({"none", "frontend", "prefill", "decode"}))
      ->capture_default_str();
  connex::AddLogLevelFlag(app);
  connex::AddInsecureFlag(app);
  if (std::optional<int> exit = connex::ParseFlags(app, argc, argv)) return *exit;
  if (!kv_standby.empty()) options.kv_standby = kv_standby == "on";
  options.pd_role = *connex::pp::ParsePdRole(pd_role, "--pd-role");  // IsMember checked it
  connex::serving::OpenAiServerOptions api;
  api.default_max_tokens = default_max_tokens;
  api.kv_budget_bytes = static_cast<int64_t>(*connex::ParseSize(kv_budget));
  api.queue_max = queue_max;
  api.stream_keepalive_ms = stream_keepalive_ms;
  api.chat_template_path = chat_template;
  api.generation_config = generation_config == "auto";
  if (!http.empty()) {
    auto http_options = connex::serving::HttpServerOptions::FromEnv();
    if (!http_options.ok()) {
      std::cerr << "connex-stage: " << http_options.status().message() << "\n";
      return 2;
    }
    api.http = *http_options;
    if (absl::Status ok = connex::serving::ParseListenAddress("--http", http, &api.http);
        !ok.ok()) {
      std::cerr << "connex-stage: " << ok.message() << "\n";
      return 2;
    }
    if (options.stage != 0) {
      std::cerr << "connex-stage: --http: only stage 0 serves the API (this is stage "
                << options.stage << ")\n";
      return 2;
    }
  }

  connex::serving::HttpServerOptions metrics_options;
  if (!metrics.empty()) {
    auto from_env = connex::serving::HttpServerOptions::FromEnv();
    if (!from_env.ok()) {
      std::cerr << "connex-stage: " << from_env.status().message() << "\n";
      return 2;
    }
    metrics_options = *from_env;
    if (absl::Status ok =
            connex::serving::ParseListenAddress("--metrics", metrics, &metrics_options);
        !ok.ok()) {
      std::cerr << "connex-stage: " << ok.message() << "\n";
      return 2;
    }
  }

  // Signals are taken synchronously by this thread; block them before any thread starts.
  const connex::TerminationSignals signals;

  // The API binds first: its address goes into stage 0's record (metadata "http"), where the
  // resume proxy and connexctl find it.
  std::unique_ptr<connex::serving::OpenAiServer> server;
  connex::pp::StageNodeOptions node_defaults;
  if (!http.empty()) {
    auto listening = connex::serving::OpenAiServer::Listen(api);
    if (!listening.ok()) {
      std::cerr << "connex-stage: --http " << http << ": " << listening.status().message() << "\n";
      return listening.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    server = *std::move(listening);
    node_defaults.metadata["http"] = server->address();
  }
  std::unique_ptr<connex::serving::StageMetricsServer> metrics_server;
  if (!metrics.empty()) {
    auto listening = connex::serving::StageMetricsServer::Listen(metrics_options);
    if (!listening.ok()) {
      std::cerr << "connex-stage: --metrics " << metrics << ": " << listening.status().message()
                << "\n";
      return listening.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    metrics_server = *std::move(listening);
    node_defaults.metadata["metrics"] = metrics_server->address();
  }
  auto stage = connex::serving::StageProcess::Start(options, node_defaults);
  if (!stage.ok()) {
    std::cerr << "connex-stage: " << stage.status().message() << "\n";
    return stage.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (server) {
    if (absl::Status attached = server->Attach(**stage); !attached.ok()) {
      std::cerr << "connex-stage: " << attached.message() << "\n";
      return 1;
    }
    std::printf("listening http=%s\n", server->address().c_str());
  }
  if (metrics_server) {
    metrics_server->Attach(**stage);
    std::printf("listening metrics=%s\n", metrics_server->address().c_str());
  }
  std::printf("ready %s epoch=%llu\n", (*stage)->lid().ToString().c_str(),
              static_cast<unsigned long long>((*stage)->node().epoch()));
  std::fflush(stdout);
  // An operator's drain (connexctl drain) ends the process as SIGTERM does, once what it had in
  // flight is over: the same path below, and exit 0.
  (*stage)->node().OnDrained([] {
    CONNEX_LOG_INFO("connex-stage: drained by the operator; exiting");
    kill(getpid(), SIGTERM);
  });
  const int signal = signals.Wait();
  CONNEX_LOG_INFO("connex-stage {}: signal {}, leaving", (*stage)->lid().ToString(), signal);
  if (server) server->Stop();  // no new requests; responses in flight finish or are cancelled
  if (metrics_server) metrics_server->Stop();
  (*stage)->Stop(/*leave=*/true);
  server.reset();  // after the node: its last callbacks come to the server
  return 0;
}
