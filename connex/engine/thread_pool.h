// A small fork-join thread pool for the engine's kernels. ParallelFor splits [0, n) into one
// contiguous range per thread, or with a grain into ranges of that many: each thread takes its own
// share's ranges front to back, then the other shares' from their backs; the calling thread
// takes part. The engine uses it only over output
// elements (rows, heads), never to split a reduction, so results do not depend on the number of
// threads nor on which thread ran which range. Thread-safe: concurrent ParallelFor calls are
// serialised. A decode step is ~80 short ParallelFor calls back to back, so the workers and the
// caller spin briefly (kSpin) for the next call or for the workers' ranges before they block: a
// futex wake cost ~45 us per call, a few per cent of a step.
#ifndef CONNEX_ENGINE_THREAD_POOL_H_
#define CONNEX_ENGINE_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "connex/base/mutex.h"

namespace connex::engine {

class ThreadPool {
 public:
  // `threads` >= 1 (the caller counts as one).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return threads_; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), in parallel, and returns when all
  // are done. grain 0: one range per thread (n / size() each). grain > 0: ranges of `grain`
  // (the last one shorter), a contiguous share of them per thread; a thread takes its share's
  // ranges in order, then takes the others' from their ends until none is left, so that a thread
  // slowed by anything else on the machine holds the call back by one range, not by its whole
  // share, while each thread still streams through memory far from the others (ranges taken in
  // turn from one counter, 128 KiB each, streamed a decode's weights ~7 % slower here:
  // docs/design/engine.md). With one thread, or n <= grain, a single fn(0, n).
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn, int64_t grain = 0);

 private:
  // A thread's share of a call's ranges: the indices [front, back) not taken yet, in one word so
  // that its owner (taking the front) and the others (taking the back) never take one twice.
  struct alignas(64) Share {
    std::atomic<uint64_t> ends{0};  // front | back << 32
  };

  void WorkerLoop(int index);
  // Thread `index`'s part of a call with a grain: its share's ranges, then the others'.
  void TakeRanges(int index, int64_t n, int64_t grain,
                  absl::FunctionRef<void(int64_t, int64_t)> fn);

  const int threads_;
  Mutex call_mu_;  // serialises ParallelFor callers
  Mutex mu_;       // its waiters: the workers for a new generation, the caller for pending_ == 0
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t grain_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<Share[]> shares_;  // one per thread, set before a call with a grain
  // Copies of generation_ and pending_, read without mu_ only to decide when to stop spinning;
  // the state itself is read under mu_.
  std::atomic<uint64_t> posted_{0};
  std::atomic<int> running_{0};
  const absl::FunctionRef<void(int64_t, int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<std::thread> workers_;
};

// CONNEX_ENGINE_THREADS (1..256), default: the hardware concurrency. InvalidArgument on a bad
// value.
absl::StatusOr<int> EngineThreadsFromEnv();

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_THREAD_POOL_H_
