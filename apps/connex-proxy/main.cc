// connex-proxy: the resume proxy in front of a served model's stage-0 replicas (docs/serving.md,
// flags in docs/configuration.md). Prints `listening http=HOST:PORT` once it serves; SIGINT or
// SIGTERM stop it (responses in flight finish within the HTTP drain timeout).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "connex/base/cli.h"
#include "connex/base/logging.h"
#include "connex/base/signals.h"
#include "connex/directory/client.h"
#include "connex/serving/listen_address.h"
#include "connex/serving/proxy.h"

int main(int argc, char** argv) {
  connex::cli::App app{
      "connex-proxy: the OpenAI-compatible front door of a served model; resumes "
      "responses on another stage-0 replica when one dies"};
  auto directory_options = connex::directory::DirectoryClientOptions::FromEnv();
  if (!directory_options.ok()) {
    std::cerr << "connex-proxy: " << directory_options.status().message() << "\n";
    return 2;
  }
  auto http_options = connex::serving::HttpServerOptions::FromEnv();
  if (!http_options.ok()) {
    std::cerr << "connex-proxy: " << http_options.status().message() << "\n";
    return 2;
  }
  connex::serving::ProxyOptions options;
  std::string directory = directory_options->directory;
  std::string listen = "127.0.0.1:8000";
  app.add_option("--directory", directory, "the directory's request endpoint")
      ->envname("CONNEX_DIRECTORY")
      ->capture_default_str();
  app.add_option("--model", options.model, "the served model's name (its stages' --model-name)")
      ->envname("CONNEX_MODEL_NAME")
      ->required();
  app.add_option("--listen", listen, "HOST:PORT to serve the API at (port 0: a free one)")
      ->envname("CONNEX_PROXY_LISTEN")
      ->capture_default_str();
  app.add_option("--retry-budget-ms", options.retry_budget_ms,
                 "how long one outage of a request may last before it fails")
      ->envname("CONNEX_PROXY_RETRY_BUDGET_MS")
      ->check(connex::cli::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  app.add_option("--max-attempts", options.max_attempts, "upstream attempts per request, at most")
      ->envname("CONNEX_PROXY_MAX_ATTEMPTS")
      ->check(connex::cli::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--connect-timeout-ms", options.connect_timeout_ms,
                 "connecting to a replica may take this long")
      ->envname("CONNEX_PROXY_CONNECT_TIMEOUT_MS")
      ->check(connex::cli::Range(int64_t{1}, int64_t{600'000}))
      ->capture_default_str();
  app.add_option("--idle-timeout-ms", options.idle_timeout_ms,
                 "a replica silent this long in a response is taken as dead")
      ->envname("CONNEX_PROXY_IDLE_TIMEOUT_MS")
      ->check(connex::cli::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  app.add_option("--stream-keepalive-ms", options.stream_keepalive_ms,
                 "a client's stream silent this long (the proxy waits for a replica, or "
                 "resumes) gets an SSE comment; 0: none")
      ->envname("CONNEX_PROXY_STREAM_KEEPALIVE_MS")
      ->check(connex::cli::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  app.add_option("--default-max-tokens", options.default_max_tokens,
                 "max_tokens of a request that gives none (as the stages' flag)")
      ->envname("CONNEX_DEFAULT_MAX_TOKENS")
      ->check(connex::cli::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  connex::AddLogLevelFlag(app);
  connex::AddInsecureFlag(app);
  if (std::optional<int> exit = connex::ParseFlags(app, argc, argv)) return *exit;
  options.http = *http_options;
  if (absl::Status ok = connex::serving::ParseListenAddress("--listen", listen, &options.http);
      !ok.ok()) {
    std::cerr << "connex-proxy: " << ok.message() << "\n";
    return 2;
  }

  // Signals are taken synchronously by this thread; block them before any thread starts.
  const connex::TerminationSignals signals;

  directory_options->directory = directory;
  auto client = connex::directory::DirectoryClient::Connect(*directory_options);
  if (!client.ok()) {
    std::cerr << "connex-proxy: " << client.status().message() << "\n";
    return 1;
  }
  auto proxy = connex::serving::ResumeProxy::Start(options);
  if (!proxy.ok()) {
    std::cerr << "connex-proxy: " << proxy.status().message() << "\n";
    return proxy.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  auto watching = connex::serving::WatchReplicas(**client, options.model, **proxy);
  if (!watching.ok()) {
    std::cerr << "connex-proxy: watching " << options.model << ": " << watching.status().message()
              << "\n";
    return 1;
  }
  std::printf("listening http=%s\n", (*proxy)->address().c_str());
  std::fflush(stdout);
  const int signal = signals.Wait();
  CONNEX_LOG_INFO("connex-proxy: signal {}, stopping", signal);
  (*client)->Unsubscribe(*watching);
  (*proxy)->Stop();
  return 0;
}
