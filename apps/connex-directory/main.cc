// connex-directory: the embedded in-memory directory server. Prints one line
// `listening bind=tcp://HOST:PORT pub=tcp://HOST:PORT` with the real ports, then serves until
// SIGINT or SIGTERM.
#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "connex/base/cli.h"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/signals.h"
#include "connex/directory/secret.h"
#include "connex/directory/server.h"

int main(int argc, char** argv) {
  // One malloc arena and fixed thresholds, so that the server's malloc_trim after a storm
  // (connex/directory/server.cc) gives the storm's memory back.
  // - One arena: ZeroMQ's I/O thread allocates every request it reads, in an arena of its own by
  //   default, and malloc_trim gives back a thread arena's free chunks only where they lie in
  //   its bins: it first merges them, and those next to the arena's top become the top, which it
  //   trims in the main arena only. A thread that allocated 2,000 chunks of 16 KB and 64 bytes,
  //   all freed by another: malloc_trim gave back nothing of 33 MB in a thread arena, all but
  //   1.7 MB with one arena. The directory kept 2.5-5 MB of a storm's memory that way in about
  //   one storm of 15 on a loaded machine
  //   (LimitedDirectoryTest.AConnectionStormsMemoryIsGivenBack). The directory's two threads share
  //   the one arena (each message is freed by the other thread than the one that allocated it,
  //   under that arena's lock, in any case).
  // - Fixed thresholds: by default glibc raises its trim threshold to twice the largest mapped
  //   block freed so far (up to 64 MB): a directory that had once freed a block of a few MB kept
  //   the next storm's memory (14 MB instead of 8 in a loaded `make test`). Blocks of 1 MB and
  //   more are mapped, and a heap's top is given back as it grows past 1 MB free.
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 20);
  absl::StatusOr<connex::directory::DirectoryServerOptions> defaults =
      connex::directory::DirectoryServerOptions::FromEnv();
  if (!defaults.ok()) {
    std::cerr << "connex-directory: " << defaults.status().message() << "\n";
    return 2;
  }
  connex::directory::DirectoryServerOptions options = *defaults;
  options.trim_heap = true;  // a process of its own (with the thresholds above)
  connex::cli::App app{"Connex directory: resolves LIDs to addresses, with leases and events"};
  app.add_option("--bind", options.bind, "request endpoint (ROUTER), tcp://HOST:PORT, port 0 = any")
      ->envname("CONNEX_DIRECTORY_BIND")
      ->capture_default_str();
  app.add_option("--pub", options.pub, "event endpoint (PUB), tcp://HOST:PORT, port 0 = any")
      ->envname("CONNEX_DIRECTORY_PUB")
      ->capture_default_str();
  app.add_option("--lease-ttl-ms", options.lease_ttl_ms, "lease TTL; expiry emits FAILED")
      ->envname("CONNEX_LEASE_TTL_MS")
      ->check(connex::cli::Range(int64_t{10}, int64_t{86'400'000}))
      ->capture_default_str();
  app.add_option("--heartbeat-ms", options.heartbeat_ms, "heartbeat interval advised to clients")
      ->envname("CONNEX_HEARTBEAT_MS")
      ->check(connex::cli::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  app.add_option("--tick-ms", options.tick_ms, "interval of revision ticks on the PUB socket")
      ->envname("CONNEX_DIRECTORY_TICK_MS")
      ->check(connex::cli::Range(int64_t{1}, int64_t{60'000}))
      ->capture_default_str();
  // The shared secret: a file, or CONNEX_DIRECTORY_TOKEN (read by FromEnv); never argv.
  connex::AddRefusedSecretFlag(app, "--token", "--token-file FILE or CONNEX_DIRECTORY_TOKEN");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file whose first line is the shared secret required for JOIN, LEAVE, "
                 "REPORT_FAILED and SNAPSHOT")
      ->envname("CONNEX_DIRECTORY_TOKEN_FILE");
  // Never from argv: a file (or CONNEX_DIRECTORY_ADMIN_TOKEN, read by FromEnv).
  std::string admin_token_file;
  app.add_option("--admin-token-file", admin_token_file,
                 "file whose first line is the operator's admin token (forced JOINs, drains)")
      ->envname("CONNEX_DIRECTORY_ADMIN_TOKEN_FILE");
  app.add_option("--state-dir", options.state_dir,
                 "directory for the durable state (epoch counter, table): epochs never repeat and "
                 "a restart is invisible; empty: in memory only")
      ->envname("CONNEX_DIRECTORY_STATE_DIR");
  app.add_option("--max-records", options.max_records,
                 "records in the whole table; a JOIN over it is refused")
      ->envname("CONNEX_DIRECTORY_MAX_RECORDS")
      ->check(connex::cli::Range(size_t{1}, size_t{1} << 24))
      ->capture_default_str();
  app.add_option("--max-records-per-model", options.max_records_per_model,
                 "records of one model; a JOIN over it is refused")
      ->envname("CONNEX_DIRECTORY_MAX_RECORDS_PER_MODEL")
      ->check(connex::cli::Range(size_t{1}, size_t{1} << 24))
      ->capture_default_str();
  app.add_option("--max-record-bytes", options.max_record_bytes,
                 "encoded size of one record (addresses and metadata)")
      ->envname("CONNEX_DIRECTORY_MAX_RECORD_BYTES")
      ->check(connex::cli::Range(size_t{256}, size_t{1} << 24))
      ->capture_default_str();
  connex::AddLogLevelFlag(app);
  connex::AddInsecureFlag(app);
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv)) return *code;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = connex::directory::ReadSecretFile(token_file);
    if (!token.ok()) {
      std::cerr << "connex-directory: --token-file: " << token.status().message() << "\n";
      return 2;
    }
    options.token = *token;
  }
  if (!admin_token_file.empty()) {
    absl::StatusOr<std::string> token = connex::directory::ReadSecretFile(admin_token_file);
    if (!token.ok()) {
      std::cerr << "connex-directory: --admin-token-file: " << token.status().message() << "\n";
      return 2;
    }
    options.admin_token = *token;
  }

  // Secure by default: with no token configured, the machine's default token (made on the first
  // start) is required, unless --insecure says this directory serves anyone who can reach it.
  std::string default_token_path;
  absl::StatusOr<bool> insecure = connex::EnvBool("CONNEX_INSECURE", false);
  if (!insecure.ok()) {
    std::cerr << "connex-directory: " << insecure.status().message() << "\n";
    return 2;
  }
  if (options.token.empty() && !*insecure) {
    absl::StatusOr<std::string> token = connex::directory::EnsureDefaultToken(&default_token_path);
    if (!token.ok()) {
      std::cerr << "connex-directory: " << token.status().message() << "\n";
      return 1;
    }
    options.token = *token;
  }

  // Signals are taken synchronously by this thread; block them before any thread starts.
  const connex::TerminationSignals signals;

  auto server = connex::directory::DirectoryServer::Start(options);
  if (!server.ok()) {
    std::cerr << "connex-directory: " << server.status().message() << "\n";
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("listening bind=%s pub=%s\n", (*server)->bind_address().c_str(),
              (*server)->pub_address().c_str());
  std::fflush(stdout);
  if (!default_token_path.empty()) {
    CONNEX_LOG_INFO(
        "directory: serving (lease TTL {} ms); clients need the token in {} (read by default "
        "by this user's clients; elsewhere: CONNEX_DIRECTORY_TOKEN_FILE)",
        options.lease_ttl_ms, default_token_path);
  } else {
    CONNEX_LOG_INFO("directory: serving (lease TTL {} ms{})", options.lease_ttl_ms,
                    options.token.empty() ? ", no token: --insecure" : ", token required");
  }
  if (options.state_dir.empty()) {
    CONNEX_LOG_WARN(
        "directory: no --state-dir: the table lives in memory only; a restart loses every route "
        "and epochs may repeat after one");
  }
  const int signal = signals.Wait();
  CONNEX_LOG_INFO("directory: signal {}, stopping", signal);
  (*server)->Stop();
  return 0;
}
