// bench_pp_memory: runs many short requests through a 3-stage pipeline (in process, mem
// transport and signals, a real directory) whose last stage returns logits [batch, vocab] F32,
// as a real LM head does, and prints the process's resident memory after the first 100
// requests and after all of them, with what the last stage keeps (replay cache, held state).
// Every stage of the pipeline lives in this process, so its RSS bounds the last stage's.
//
//   bench_pp_memory [--requests 10000] [--vocab 32000] [--tokens 4]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "connex/base/cli.h"
#include "connex/base/logging.h"
#include "connex/directory/testing/test_directory.h"
#include "connex/pp/testing/cluster.h"

namespace {

// Resident set size of this process in KiB (VmRSS of /proc/self/status), -1 if unknown.
long RssKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  connex::cli::App app{"Connex step protocol: memory after many requests"};
  int requests = 10000;
  int vocab = 32000;
  int tokens = 4;
  app.add_option("--requests", requests, "requests to run")
      ->check(connex::cli::Range(100, 10'000'000));
  app.add_option("--vocab", vocab, "width of the last stage's logits")
      ->check(connex::cli::Range(1, 1 << 20));
  app.add_option("--tokens", tokens, "tokens generated per request")
      ->check(connex::cli::Range(1, 1000));
  connex::AddLogLevelFlag(app, "warn");
  if (std::optional<int> code = connex::ParseFlags(app, argc, argv)) return *code;
  auto server = connex::directory::testing::StartTestDirectory();
  if (!server.ok()) {
    std::cerr << "bench_pp_memory: directory: " << server.status().message() << "\n";
    return 1;
  }
  connex::pp::StageNodeOptions o;
  o.slot_bytes = 1 << 20;
  o.ring_slots = 8;
  connex::pp::testing::Cluster c(**server, "mem", 3, 1, o);
  if (absl::Status s = c.StartAll(1); !s.ok()) {
    std::cerr << "bench_pp_memory: " << s.message() << "\n";
    return 1;
  }
  c.engine(2, 0)->SetEmitLogits(vocab);
  long after_100 = 0;
  const size_t window = 64;  // requests in flight
  int submitted = 0;
  size_t failed = 0;
  // Outcomes of finished requests are forgotten as the run goes, so that the harness's own
  // bookkeeping does not count as the pipeline's memory.
  auto run_until = [&](int n) {
    while (submitted < n) {
      size_t in_flight = c.InFlight();
      while (in_flight < window && submitted < n) {
        ++submitted;
        std::vector<int32_t> prompt = {submitted % 200, (submitted * 7) % 200, 3};
        if (!c.Submit(0, static_cast<uint64_t>(submitted), prompt, tokens).ok()) return false;
        ++in_flight;
      }
      failed += c.ForgetFinished();
      std::this_thread::yield();
    }
    bool done = c.AwaitAll(120000);
    failed += c.ForgetFinished();
    return done;
  };
  if (!run_until(100)) {
    std::cerr << "bench_pp_memory: the first 100 requests did not finish\n";
    return 1;
  }
  after_100 = RssKiB();
  if (!run_until(requests)) {
    std::cerr << "bench_pp_memory: the requests did not finish\n";
    return 1;
  }
  c.AwaitNoStateHeld(10000);
  long after_all = RssKiB();
  connex::pp::StageNodeStats last = c.node(2, 0)->stats();
  std::printf("requests           %d (%zu failed), %d tokens each, logits width %d\n", requests,
              failed, tokens, vocab);
  std::printf("rss after 100      %.1f MB\n", after_100 / 1024.0);
  std::printf("rss after %-8d %.1f MB (%+.1f MB)\n", requests, after_all / 1024.0,
              (after_all - after_100) / 1024.0);
  std::printf("last stage         replay cache %.1f KB, %zu requests held, %lu released\n",
              last.replay_bytes / 1024.0, last.held_requests,
              static_cast<unsigned long>(last.released));
  return failed == 0 ? 0 : 1;
}
