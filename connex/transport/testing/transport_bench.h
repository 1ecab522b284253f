// Data-plane benchmarks behind `connex-bench transport` and `connex-bench peer-death`: they start
// a peer process (`connex-bench serve`) themselves, or use one given with --peer, and measure
// one-sided read bandwidth and latency, and the delay from a SIGKILL/SIGSTOP to the event.
// Programs that print figures; never used as timed assertions. Thread-compatible.
#ifndef CONNEX_TRANSPORT_TESTING_TRANSPORT_BENCH_H_
#define CONNEX_TRANSPORT_TESTING_TRANSPORT_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport::testing {

// Limits of the benchmarks' settings (connex-bench range-checks its flags with them).
inline constexpr uint64_t kMaxBenchBytes = uint64_t{4} << 30;  // one read, copy or peer buffer
inline constexpr int kMaxBenchInflight = 256;                  // reader threads
inline constexpr int kMaxBenchRuns = 10'000;                   // peers killed
inline constexpr double kMaxBenchSeconds = 3600;               // per size

struct ReadBenchOptions {
  TransportOptions transport;   // the reader's engine (backend, heartbeat, ...)
  std::vector<uint64_t> sizes;  // bytes per read
  double seconds = 1.0;         // per size
  int inflight = 1;             // reader threads, each with one read outstanding
  // > 0: each reader sleeps this long between reads (single reads after a pause, as a KV
  // handoff's: connections and caches go cold); GB/s is then bytes over the time spent reading.
  int gap_ms = 0;
  std::string peer;      // "LID;0xBASE;SIZE;ADDRESS[;ADDRESS...]" from `serve`, or empty
  std::string self_exe;  // this binary, started as `serve` when `peer` is empty
};

struct ReadBenchResult {
  uint64_t size = 0;
  double gbps = 0;  // 1e9 bytes per second, all threads together
  double p50_us = 0;
  double p99_us = 0;
  uint64_t reads = 0;
};

// InvalidArgument: no size, a size, `inflight` or `seconds` outside the limits above.
absl::StatusOr<std::vector<ReadBenchResult>> RunReadBench(const ReadBenchOptions& options);

// Single-thread memcpy between two pre-faulted buffers, the same access pattern as an shm read.
// InvalidArgument as RunReadBench; ResourceExhausted when the buffers cannot be allocated.
absl::StatusOr<std::vector<ReadBenchResult>> RunMemcpyBench(const std::vector<uint64_t>& sizes,
                                                            double seconds);

struct DeathBenchOptions {
  TransportOptions transport;
  int runs = 10;
  bool stop = false;  // SIGSTOP (time to kSuspected) instead of SIGKILL (time to kDead)
  std::string self_exe;
};

struct DeathBenchResult {
  std::vector<double> delays_ms;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
};

// InvalidArgument: `runs` outside [1, kMaxBenchRuns].
absl::StatusOr<DeathBenchResult> RunDeathBench(const DeathBenchOptions& options);

// `serve`: a peer with a `size`-byte buffer; prints the --peer line and serves until stdin EOF.
absl::Status RunServe(const TransportOptions& options, uint64_t size);

}  // namespace connex::transport::testing

#endif  // CONNEX_TRANSPORT_TESTING_TRANSPORT_BENCH_H_
