// connex-bench: prints data-plane figures (never a test).
//   connex-bench transport --backend B --sizes 4K,64K,1M,16M,64M --seconds S [--inflight N]
//                          [--peer SPEC] [--json]
//   connex-bench peer-death --backend B --runs N [--stop] [--json]
//   connex-bench serve --backend B [--size N] [--lid LID]
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "connex/base/cli.h"
#include "connex/base/config.h"
#include "connex/base/json_text.h"
#include "connex/base/strings.h"
#include "connex/transport/testing/transport_bench.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace {

using namespace connex;
using namespace connex::transport;

// A bad value (InvalidArgument) exits 2 like a usage error; anything else 1.
int Fail(const absl::Status& s) {
  std::cerr << "connex-bench: " << s << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? kUsageExitCode : 1;
}

std::vector<uint64_t> ParseSizes(const std::string& text) {
  std::vector<uint64_t> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    sizes.push_back(ParseSize(AsStd(part)).value());  // validated by SizeRange
  }
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  connex::cli::App app{"connex-bench: data-plane benchmarks"};
  app.require_subcommand(1);
  app.fallthrough();  // --log-level also after the sub-command
  AddLogLevelFlag(app);
  std::string backend_text = "tcp";
  std::string sizes_text = "4K,64K,1M,16M,64M";
  double seconds = 1.0;
  int inflight = 1;
  std::string peer;
  bool json = false;
  int runs = 10;
  bool stop = false;
  std::string size_text = "64M";
  std::string lid_text = "bench/g1/s0/r0";
  int heartbeat_ms = 250, suspect_ms = 1000, connections = 4, spin_us = 50;
  std::string ucx_peer_errors = "auto";

  // Ranges as TransportOptions::FromEnv checks the variables.
  auto add_common = [&](connex::cli::App* sub) {
    sub->add_option("--backend", backend_text, "auto|mem|tcp|shm|ucx")
        ->envname("CONNEX_PP_BACKEND")
        ->check(connex::cli::IsMember({"auto", "mem", "tcp", "shm", "ucx"}))
        ->capture_default_str();
    sub->add_option("--heartbeat-ms", heartbeat_ms, "transport heartbeat period")
        ->envname("CONNEX_TRANSPORT_HEARTBEAT_MS")
        ->check(connex::cli::Range(1, 600'000))
        ->capture_default_str();
    sub->add_option("--suspect-ms", suspect_ms, "silence before a peer is suspected")
        ->envname("CONNEX_TRANSPORT_SUSPECT_MS")
        ->check(connex::cli::Range(1, 3'600'000))
        ->capture_default_str();
    sub->add_option("--tcp-connections", connections, "tcp data connections per peer")
        ->envname("CONNEX_TRANSPORT_TCP_CONNECTIONS")
        ->check(connex::cli::Range(1, 64))
        ->capture_default_str();
    sub->add_option("--spin-us", spin_us, "busy-poll before blocking")
        ->envname("CONNEX_TRANSPORT_SPIN_US")
        ->check(connex::cli::Range(0, 100'000))
        ->capture_default_str();
    sub->add_option("--ucx-peer-errors", ucx_peer_errors,
                    "auto|on|off: UCX endpoints with peer error handling (auto: off for a "
                    "peer on this host, so UCX can use shared memory)")
        ->envname("CONNEX_TRANSPORT_UCX_PEER_ERRORS")
        ->capture_default_str();
  };
  const connex::cli::Validator sizes_check = SizeRange(1, testing::kMaxBenchBytes, /*list=*/true);
  const connex::cli::Validator seconds_check = connex::cli::Range(0.001, testing::kMaxBenchSeconds);
  connex::cli::App* transport =
      app.add_subcommand("transport", "one-sided read bandwidth and latency");
  add_common(transport);
  transport->add_option("--sizes", sizes_text, "read sizes, e.g. 4K,64K,1M")
      ->check(sizes_check)
      ->capture_default_str();
  transport->add_option("--seconds", seconds, "seconds per size")
      ->check(seconds_check)
      ->capture_default_str();
  int gap_ms = 0;
  transport
      ->add_option("--gap-ms", gap_ms,
                   "pause between one reader's reads (0: back to back); GB/s is then over the "
                   "time spent reading")
      ->check(connex::cli::Range(0, 60'000))
      ->capture_default_str();
  transport->add_option("--inflight", inflight, "reads outstanding (one reader thread each)")
      ->check(connex::cli::Range(1, testing::kMaxBenchInflight))
      ->capture_default_str();
  transport->add_option("--peer", peer, "a peer started with `connex-bench serve` (its spec)");
  transport->add_flag("--json", json, "print one JSON object");
  connex::cli::App* death =
      app.add_subcommand("peer-death", "delay from SIGKILL/SIGSTOP to the event");
  add_common(death);
  death->add_option("--runs", runs, "number of peers to kill")
      ->check(connex::cli::Range(1, testing::kMaxBenchRuns))
      ->capture_default_str();
  death->add_flag("--stop", stop, "SIGSTOP (time to suspicion) instead of SIGKILL");
  death->add_flag("--json", json, "print one JSON object");
  connex::cli::App* memcpy_cmd =
      app.add_subcommand("memcpy", "single-thread memcpy bandwidth (the shm reference)");
  memcpy_cmd->add_option("--sizes", sizes_text, "copy sizes, e.g. 4K,64K,1M")
      ->check(sizes_check)
      ->capture_default_str();
  memcpy_cmd->add_option("--seconds", seconds, "seconds per size")
      ->check(seconds_check)
      ->capture_default_str();
  memcpy_cmd->add_flag("--json", json, "print one JSON object");
  connex::cli::App* serve = app.add_subcommand("serve", "a peer for `transport --peer`");
  add_common(serve);
  serve->add_option("--size", size_text, "buffer size")
      ->check(SizeRange(1, testing::kMaxBenchBytes))
      ->capture_default_str();
  serve->add_option("--lid", lid_text, "the peer's LID")->capture_default_str();
  if (std::optional<int> code = ParseFlags(app, argc, argv)) return *code;

  absl::StatusOr<Backend> backend = ParseBackend(backend_text);
  if (!backend.ok()) return Fail(backend.status());
  TransportOptions options;
  {
    absl::StatusOr<TransportOptions> env =
        TransportOptions::FromEnv(Lid::Parse("bench/g0/s0/r0").value());
    if (!env.ok()) return Fail(env.status());
    options = *env;
  }
  options.backend = *backend;
  options.heartbeat_ms = heartbeat_ms;
  options.suspect_ms = suspect_ms;
  options.tcp_connections = connections;
  options.spin_us = spin_us;
  {
    absl::StatusOr<UcxPeerErrors> mode = ParseUcxPeerErrors(ucx_peer_errors);
    if (!mode.ok()) return Fail(mode.status());
    options.ucx_peer_errors = *mode;
  }
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();

  if (serve->parsed()) {
    absl::StatusOr<Lid> lid = Lid::Parse(lid_text);
    if (!lid.ok()) return Fail(lid.status());
    options.local_lid = *lid;
    absl::Status s = testing::RunServe(options, ParseSize(size_text).value());
    return s.ok() ? 0 : Fail(s);
  }
  if (memcpy_cmd->parsed()) {
    auto results = testing::RunMemcpyBench(ParseSizes(sizes_text), seconds);
    if (!results.ok()) return Fail(results.status());
    nlohmann::json j;
    j["backend"] = "memcpy";
    j["results"] = nlohmann::json::array();
    for (const auto& r : *results) {
      if (json) {
        j["results"].push_back(
            {{"size", r.size}, {"gbps", r.gbps}, {"p50_us", r.p50_us}, {"p99_us", r.p99_us}});
      } else {
        std::cout << fmt::format("memcpy {:>10} bytes: {:8.3f} GB/s, p50 {:.2f} us\n", r.size,
                                 r.gbps, r.p50_us);
      }
    }
    if (json) std::cout << DumpJson(j) << "\n";
    return 0;
  }
  if (transport->parsed()) {
    testing::ReadBenchOptions o;
    o.transport = options;
    o.sizes = ParseSizes(sizes_text);
    o.seconds = seconds;
    o.inflight = inflight;
    o.gap_ms = gap_ms;
    o.peer = peer;
    o.self_exe = self;
    auto results = testing::RunReadBench(o);
    if (!results.ok()) return Fail(results.status());
    if (json) {
      nlohmann::json j;
      j["backend"] = backend_text;
      j["results"] = nlohmann::json::array();
      for (const auto& r : *results) {
        j["results"].push_back(
            {{"size", r.size}, {"gbps", r.gbps}, {"p50_us", r.p50_us}, {"p99_us", r.p99_us}});
      }
      std::cout << DumpJson(j) << "\n";
    } else {
      std::cout << fmt::format("backend {} inflight {} seconds {}\n", backend_text, inflight,
                               seconds);
      std::cout << fmt::format("{:>10} {:>10} {:>10} {:>10} {:>10}\n", "size", "GB/s", "p50_us",
                               "p99_us", "reads");
      for (const auto& r : *results) {
        std::cout << fmt::format("{:>10} {:>10.3f} {:>10.1f} {:>10.1f} {:>10}\n", r.size, r.gbps,
                                 r.p50_us, r.p99_us, r.reads);
      }
    }
    return 0;
  }
  testing::DeathBenchOptions o;
  o.transport = options;
  o.runs = runs;
  o.stop = stop;
  o.self_exe = self;
  auto result = testing::RunDeathBench(o);
  if (!result.ok()) return Fail(result.status());
  if (json) {
    nlohmann::json j{
        {"backend", backend_text},  {"signal", stop ? "STOP" : "KILL"}, {"runs", runs},
        {"p50_ms", result->p50_ms}, {"p99_ms", result->p99_ms},         {"max_ms", result->max_ms}};
    std::cout << DumpJson(j) << "\n";
  } else {
    std::cout << fmt::format(
        "backend {} signal {} runs {}: p50 {:.2f} ms, p99 {:.2f} ms, max "
        "{:.2f} ms\n",
        backend_text, stop ? "STOP" : "KILL", runs, result->p50_ms, result->p99_ms, result->max_ms);
  }
  return 0;
}
