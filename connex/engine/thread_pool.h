// A small fork-join thread pool for the engine's kernels. ParallelFor splits [0, n) into one
// contiguous range per thread; the calling thread runs the first range itself. The engine uses
// it only over output elements (rows, heads), never to split a reduction, so results do not
// depend on the number of threads. Thread-safe: concurrent ParallelFor calls are serialised.
#ifndef CONNEX_ENGINE_THREAD_POOL_H_
#define CONNEX_ENGINE_THREAD_POOL_H_

#include <cstdint>
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
  // are done.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn);

 private:
  void WorkerLoop(int index);

  const int threads_;
  Mutex call_mu_;  // serialises ParallelFor callers
  Mutex mu_;       // its waiters: the workers for a new generation, the caller for pending_ == 0
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  const absl::FunctionRef<void(int64_t, int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<std::thread> workers_;
};

// CONNEX_ENGINE_THREADS (1..256), default: the hardware concurrency. InvalidArgument on a bad
// value.
absl::StatusOr<int> EngineThreadsFromEnv();

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_THREAD_POOL_H_
