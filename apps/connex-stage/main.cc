// connex-stage: one pipeline stage of a served model as its own process (serving::StageProcess).
// It loads its layer slice, registers (model, stage, 0, replica) in the directory, serves steps,
// and prints `ready LID epoch=E` once it has joined. SIGTERM or SIGINT leaves gracefully (LEFT,
// in-flight steps finish); SIGKILL is a crash the others ride out.
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "connex/base/logging.h"
#include "connex/serving/stage.h"

int main(int argc, char** argv) {
  connex::serving::StageProcessOptions options;
  CLI::App app{"connex-stage: one pipeline stage of a served model"};
  app.add_option("--directory", options.directory, "the directory's request endpoint")
      ->envname("CONNEX_DIRECTORY")
      ->capture_default_str();
  app.add_option("--model", options.model_path,
                 "checkpoint: a .safetensors file or a directory with model.safetensors")
      ->envname("CONNEX_MODEL")
      ->required();
  app.add_option("--model-name", options.model_name,
                 "the served model's name (the LIDs' model); default: the checkpoint's name")
      ->envname("CONNEX_MODEL_NAME");
  app.add_option("--stage", options.stage, "this process's pipeline stage")
      ->envname("CONNEX_STAGE")
      ->check(CLI::Range(0u, 1023u))
      ->required();
  app.add_option("--stages", options.stages, "stages of the pipeline")
      ->envname("CONNEX_STAGES")
      ->check(CLI::Range(1u, 1024u))
      ->required();
  app.add_option("--replica", options.replica, "replica chain")
      ->envname("CONNEX_REPLICA")
      ->check(CLI::Range(0u, 1u << 20))
      ->capture_default_str();
  app.add_option("--backend", options.backend, "data plane: auto, tcp, shm or ucx")
      ->envname("CONNEX_PP_BACKEND")
      ->check(CLI::IsMember({"auto", "tcp", "shm", "ucx"}))
      ->capture_default_str();
  app.add_option("--signal-host", options.signal_host, "interface the signal socket binds")
      ->envname("CONNEX_SIGNAL_HOST")
      ->capture_default_str();
  app.add_option("--threads", options.threads, "kernel threads (0: CONNEX_ENGINE_THREADS or all)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->envname("CONNEX_LOG_LEVEL");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!log_level.empty()) connex::Log().set_level(spdlog::level::from_str(log_level));

  // Signals are taken synchronously by this thread; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto stage = connex::serving::StageProcess::Start(options);
  if (!stage.ok()) {
    std::cerr << "connex-stage: " << stage.status().message() << "\n";
    return stage.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("ready %s epoch=%llu\n", (*stage)->lid().ToString().c_str(),
              static_cast<unsigned long long>((*stage)->node().epoch()));
  std::fflush(stdout);
  int signal = 0;
  sigwait(&signals, &signal);
  CONNEX_LOG_INFO("connex-stage {}: signal {}, leaving", (*stage)->lid().ToString(), signal);
  (*stage)->Stop(/*leave=*/true);
  return 0;
}
