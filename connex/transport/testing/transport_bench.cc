#include "connex/transport/testing/transport_bench.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "connex/base/mutex.h"
#include "connex/base/stats.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/testing/peer_server.h"
#include "fmt/format.h"

namespace connex::transport::testing {
namespace {

using Clock = std::chrono::steady_clock;

struct PeerInfo {
  PeerRef ref;
  uint64_t base = 0;
  uint64_t size = 0;
};

absl::StatusOr<PeerInfo> ParsePeer(std::string_view text) {
  std::vector<std::string> parts = absl::StrSplit(AsAbsl(text), ';');
  PeerInfo info;
  if (parts.size() < 4) {
    return absl::InvalidArgumentError(
        StrCat("--peer '", text, "' is not LID;0xBASE;SIZE;ADDRESS[;ADDRESS...]"));
  }
  CONNEX_ASSIGN_OR_RETURN(info.ref.lid, Lid::Parse(parts[0]));
  char* end = nullptr;
  info.base = std::strtoull(parts[1].c_str(), &end, 16);
  if (*end != '\0' || info.base == 0 || !absl::SimpleAtoi(parts[2], &info.size)) {
    return absl::InvalidArgumentError(StrCat("--peer '", text, "': bad base or size"));
  }
  info.ref.addresses.assign(parts.begin() + 3, parts.end());
  return info;
}

// A `serve` child process.
class Child {
 public:
  ~Child() { Stop(); }
  absl::StatusOr<PeerInfo> Start(const std::string& exe, Backend backend, uint64_t size,
                                 const std::string& lid) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
      return absl::InternalError("pipe failed");
    }
    std::string b(BackendName(backend)), s = std::to_string(size);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      execl(exe.c_str(), exe.c_str(), "serve", "--backend", b.c_str(), "--size", s.c_str(), "--lid",
            lid.c_str(), nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
    std::string line;
    char c;
    pollfd p{from_, POLLIN, 0};
    while (true) {
      if (poll(&p, 1, 30000) <= 0) return absl::UnavailableError("serve did not start");
      if (read(from_, &c, 1) != 1) return absl::UnavailableError("serve exited");
      if (c == '\n') break;
      line += c;
    }
    // "PEER <spec>"
    if (line.rfind("PEER ", 0) != 0) {
      return absl::UnavailableError(StrCat("serve said '", line, "'"));
    }
    return ParsePeer(std::string_view(line).substr(5));
  }
  pid_t pid() const { return pid_; }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);
    close(to_);
    int status;
    for (int i = 0; i < 300 && waitpid(pid_, &status, WNOHANG) == 0; ++i) usleep(10000);
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    close(from_);
    pid_ = -1;
  }
  void Reap() {
    int status;
    waitpid(pid_, &status, 0);
    close(to_);
    close(from_);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
};

// The checks behind the limits of transport_bench.h (the CLI checks its flags first; this keeps a
// library caller from a crash or a hang).
absl::Status ValidateSizes(const std::vector<uint64_t>& sizes, double seconds) {
  if (sizes.empty()) return absl::InvalidArgumentError("no sizes to measure");
  for (uint64_t size : sizes) {
    if (size < 1 || size > kMaxBenchBytes) {
      return absl::InvalidArgumentError(
          StrCat("size ", size, " is outside [1, ", kMaxBenchBytes, "] bytes"));
    }
  }
  if (!(seconds > 0 && seconds <= kMaxBenchSeconds)) {
    return absl::InvalidArgumentError(
        StrCat("seconds ", seconds, " is outside (0, ", kMaxBenchSeconds, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunServe(const TransportOptions& options, uint64_t size) {
  if (size < 1 || size > kMaxBenchBytes) {
    return absl::InvalidArgumentError(
        StrCat("buffer size ", size, " is outside [1, ", kMaxBenchBytes, "] bytes"));
  }
  CONNEX_ASSIGN_OR_RETURN(TransferEnginePtr engine, CreateTransferEngine(options));
  CONNEX_ASSIGN_OR_RETURN(void* buffer, engine->AllocateManagedBuffer(size));
  auto* bytes = static_cast<uint8_t*>(buffer);
  for (uint64_t i = 0; i < size; ++i) bytes[i] = PatternByte(1, i);
  std::string spec = fmt::format("{};{:#x};{}", options.local_lid.ToString(),
                                 reinterpret_cast<uint64_t>(buffer), size);
  for (const std::string& a : engine->LocalAddresses()) spec += ";" + a;
  std::cout << "PEER " << spec << std::endl;
  std::cerr << "serving; read it with: connex-bench transport --backend "
            << BackendName(options.backend) << " --peer '" << spec << "'" << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return engine->FreeManagedBuffer(buffer);
}

absl::StatusOr<std::vector<ReadBenchResult>> RunReadBench(const ReadBenchOptions& options) {
  CONNEX_RETURN_IF_ERROR(ValidateSizes(options.sizes, options.seconds));
  if (options.gap_ms < 0 || options.gap_ms > 60'000) {
    return absl::InvalidArgumentError(StrCat("gap_ms ", options.gap_ms, " is outside [0, 60000]"));
  }
  if (options.inflight < 1 || options.inflight > kMaxBenchInflight) {
    return absl::InvalidArgumentError(
        StrCat("inflight ", options.inflight, " is outside [1, ", kMaxBenchInflight, "]"));
  }
  uint64_t max_size = *std::max_element(options.sizes.begin(), options.sizes.end());
  Child child;
  PeerInfo peer;
  if (options.peer.empty()) {
    CONNEX_ASSIGN_OR_RETURN(
        peer, child.Start(options.self_exe, options.transport.backend, max_size, "bench/g1/s0/r0"));
  } else {
    CONNEX_ASSIGN_OR_RETURN(peer, ParsePeer(options.peer));
  }
  if (peer.size < max_size) {
    return absl::InvalidArgumentError(
        StrCat("peer buffer of ", peer.size, " bytes is smaller than ", max_size));
  }
  CONNEX_ASSIGN_OR_RETURN(TransferEnginePtr engine, CreateTransferEngine(options.transport));
  const int threads = options.inflight;
  std::vector<void*> locals;
  for (int t = 0; t < threads; ++t) {
    CONNEX_ASSIGN_OR_RETURN(void* b, engine->AllocateManagedBuffer(max_size));
    std::memset(b, 0, max_size);  // fault the pages in before timing
    locals.push_back(b);
  }
  CONNEX_RETURN_IF_ERROR(engine->Connect(peer.ref));
  std::vector<ReadBenchResult> results;
  for (uint64_t size : options.sizes) {
    // Warm up: connections, page faults, caches.
    for (int t = 0; t < threads; ++t) {
      CONNEX_RETURN_IF_ERROR(engine->TransferSyncRead(peer.ref, locals[t], peer.base, size));
    }
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> reads{0};
    Mutex mu;
    std::vector<double> latencies;
    absl::Status error;
    std::vector<std::thread> workers;
    auto start = Clock::now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::vector<double> mine;
        mine.reserve(1 << 16);
        while (!stop.load(std::memory_order_relaxed)) {
          auto t0 = Clock::now();
          absl::Status s = engine->TransferSyncRead(peer.ref, locals[t], peer.base, size);
          auto t1 = Clock::now();
          if (!s.ok()) {
            MutexLock lock(&mu);
            error = s;
            break;
          }
          mine.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          reads.fetch_add(1, std::memory_order_relaxed);
          if (options.gap_ms > 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(options.gap_ms));
          }
        }
        MutexLock lock(&mu);
        latencies.insert(latencies.end(), mine.begin(), mine.end());
      });
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(options.seconds));
    stop = true;
    for (auto& w : workers) w.join();
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    CONNEX_RETURN_IF_ERROR(error);
    // Spot-check the bytes of the last read.
    auto* got = static_cast<uint8_t*>(locals[0]);
    for (uint64_t i = 0; i < size; i += 4099) {
      if (got[i] != PatternByte(1, i)) {
        return absl::DataLossError(StrCat("byte ", i, " of a ", size, "-byte read is wrong"));
      }
    }
    ReadBenchResult r;
    r.size = size;
    r.reads = reads.load();
    double reading = elapsed;  // seconds the readers spent reading
    if (options.gap_ms > 0) {
      reading = 0;
      for (double us : latencies) reading += us / 1e6;
      reading /= threads;
    }
    r.gbps =
        reading > 0 ? static_cast<double>(r.reads) * static_cast<double>(size) / reading / 1e9 : 0;
    r.p50_us = Percentile(latencies, 0.50);
    r.p99_us = Percentile(latencies, 0.99);
    results.push_back(r);
  }
  for (void* b : locals) CONNEX_RETURN_IF_ERROR(engine->FreeManagedBuffer(b));
  return results;
}

absl::StatusOr<std::vector<ReadBenchResult>> RunMemcpyBench(const std::vector<uint64_t>& sizes,
                                                            double seconds) {
  CONNEX_RETURN_IF_ERROR(ValidateSizes(sizes, seconds));
  uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> src, dst;
  try {
    src.assign(max_size, 1);
    dst.assign(max_size, 0);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        StrCat("cannot allocate two buffers of ", max_size, " bytes for the copies"));
  }
  std::vector<ReadBenchResult> results;
  for (uint64_t size : sizes) {
    std::vector<double> latencies;
    uint64_t copies = 0;
    auto start = Clock::now();
    auto end = start + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), size);
      auto t1 = Clock::now();
      // Keep the compiler from dropping the copy.
      asm volatile("" : : "r"(dst.data()) : "memory");
      latencies.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      ++copies;
    }
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    ReadBenchResult r;
    r.size = size;
    r.reads = copies;
    r.gbps = static_cast<double>(copies) * static_cast<double>(size) / elapsed / 1e9;
    r.p50_us = Percentile(latencies, 0.50);
    r.p99_us = Percentile(latencies, 0.99);
    results.push_back(r);
  }
  return results;
}

absl::StatusOr<DeathBenchResult> RunDeathBench(const DeathBenchOptions& options) {
  if (options.runs < 1 || options.runs > kMaxBenchRuns) {
    return absl::InvalidArgumentError(
        StrCat("runs ", options.runs, " is outside [1, ", kMaxBenchRuns, "]"));
  }
  CONNEX_ASSIGN_OR_RETURN(TransferEnginePtr engine, CreateTransferEngine(options.transport));
  const PeerEventKind wanted = options.stop ? PeerEventKind::kSuspected : PeerEventKind::kDead;
  Mutex mu;
  Lid current;
  bool got = false;
  Clock::time_point got_at;
  bool connected = false;
  uint64_t sub = engine->SubscribePeerEvents([&](const PeerEvent& e) {
    auto now = Clock::now();
    MutexLock lock(&mu);
    if (e.lid != current) return;
    if (e.kind == PeerEventKind::kConnected) connected = true;
    if (e.kind == wanted && !got) {
      got = true;
      got_at = now;
    }
  });
  DeathBenchResult result;
  absl::Status status;
  for (int run = 0; run < options.runs && status.ok(); ++run) {
    std::string lid_text = StrCat("bench/g1/s0/r", run);
    Child child;
    absl::StatusOr<PeerInfo> peer =
        child.Start(options.self_exe, options.transport.backend, 4096, lid_text);
    if (!peer.ok()) {
      status = peer.status();
      break;
    }
    {
      MutexLock lock(&mu);
      current = peer->ref.lid;
      got = connected = false;
    }
    status = engine->Connect(peer->ref);
    if (!status.ok()) break;
    {
      MutexLock lock(&mu);
      if (!mu.AwaitWithTimeout(absl::Condition(&connected), absl::Seconds(10))) {
        status = absl::DeadlineExceededError("no kConnected event");
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let heartbeats settle
    auto sent = Clock::now();
    kill(child.pid(), options.stop ? SIGSTOP : SIGKILL);
    {
      MutexLock lock(&mu);
      if (!mu.AwaitWithTimeout(absl::Condition(&got), absl::Seconds(30))) {
        status = absl::DeadlineExceededError(
            StrCat("no ", PeerEventKindName(wanted), " event within 30 s"));
        break;
      }
      result.delays_ms.push_back(std::chrono::duration<double, std::milli>(got_at - sent).count());
    }
    if (options.stop) {
      kill(child.pid(), SIGKILL);
      kill(child.pid(), SIGCONT);
    }
    child.Reap();
  }
  engine->UnsubscribePeerEvents(sub);
  CONNEX_RETURN_IF_ERROR(status);
  result.p50_ms = Percentile(result.delays_ms, 0.50);
  result.p99_ms = Percentile(result.delays_ms, 0.99);
  result.max_ms = Percentile(result.delays_ms, 1.0);
  return result;
}

}  // namespace connex::transport::testing
