#include "connex/engine/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "connex/base/config.h"

namespace connex::engine {
namespace {

// How long a worker waits for the next call, and the caller for the workers, before blocking.
constexpr std::chrono::microseconds kSpin{50};

// Spins until done() or kSpin has passed.
template <typename Done>
void SpinUntil(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  while (!done()) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (std::chrono::steady_clock::now() >= until) return;
  }
}

constexpr uint64_t Ends(uint64_t front, uint64_t back) { return front | back << 32; }

// Takes the first (front) or last range index left in `ends`; false when none is.
bool Take(std::atomic<uint64_t>& ends, bool front, int64_t* index) {
  uint64_t v = ends.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t f = v & 0xffffffffu, b = v >> 32;
    if (f >= b) return false;
    const uint64_t next = front ? Ends(f + 1, b) : Ends(f, b - 1);
    if (ends.compare_exchange_weak(v, next, std::memory_order_relaxed)) {
      *index = static_cast<int64_t>(front ? f : b - 1);
      return true;
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads)
    : threads_(std::max(1, threads)), shares_(std::make_unique<Share[]>(threads_)) {
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::TakeRanges(int index, int64_t n, int64_t grain,
                            absl::FunctionRef<void(int64_t, int64_t)> fn) {
  int64_t k;
  for (int j = 0; j < threads_; ++j) {
    Share& share = shares_[(index + j) % threads_];
    while (Take(share.ends, /*front=*/j == 0, &k)) fn(k * grain, std::min(n, (k + 1) * grain));
  }
}

void ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn,
                             int64_t grain) {
  if (n <= 0) return;
  if (threads_ == 1 || n == 1 || (grain > 0 && n <= grain)) {
    fn(0, n);
    return;
  }
  MutexLock call_lock(&call_mu_);
  {
    MutexLock lock(&mu_);  // the unlock wakes the workers
    if (grain > 0) {
      // Range indices fit the shares' 32-bit halves: a coarser grain for a (never seen) huge n.
      grain = std::max(grain, (n >> 31) + 1);
      const uint64_t ranges = static_cast<uint64_t>((n + grain - 1) / grain);
      for (int i = 0; i < threads_; ++i) {  // published by the unlock
        shares_[i].ends.store(Ends(ranges * i / threads_, ranges * (i + 1) / threads_),
                              std::memory_order_relaxed);
      }
    }
    n_ = n;
    grain_ = grain;
    fn_ = &fn;
    pending_ = threads_ - 1;
    running_.store(pending_, std::memory_order_relaxed);
    ++generation_;
    posted_.store(generation_, std::memory_order_release);
  }
  if (grain > 0) {
    TakeRanges(0, n, grain, fn);
  } else if (const int64_t end = n / threads_; end > 0) {
    fn(0, end);
  }
  SpinUntil([this] { return running_.load(std::memory_order_acquire) == 0; });
  MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&done));
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int64_t n, grain;
    const absl::FunctionRef<void(int64_t, int64_t)>* fn;
    SpinUntil([&] { return posted_.load(std::memory_order_acquire) != seen; });
    {
      MutexLock lock(&mu_);
      auto started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || generation_ != seen;
      };
      mu_.Await(absl::Condition(&started));
      if (stop_) return;
      seen = generation_;
      n = n_;
      grain = grain_;
      fn = fn_;
    }
    if (grain > 0) {
      TakeRanges(index, n, grain, *fn);
    } else {
      const int64_t begin = n * index / threads_, end = n * (index + 1) / threads_;
      if (begin < end) (*fn)(begin, end);
    }
    MutexLock lock(&mu_);  // the unlock wakes the caller
    --pending_;
    running_.fetch_sub(1, std::memory_order_release);
  }
}

absl::StatusOr<int> EngineThreadsFromEnv() {
  int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  absl::StatusOr<int64_t> v = EnvInt("CONNEX_ENGINE_THREADS", hw, 1, 256);
  if (!v.ok()) return v.status();
  return static_cast<int>(*v);
}

}  // namespace connex::engine
