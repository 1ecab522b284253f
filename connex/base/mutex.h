// Mutex: the project's lock, with absl::Mutex's interface (MutexLock, Await, AwaitWithTimeout on
// an absl::Condition) and its thread-safety annotations, built on std::mutex and
// std::condition_variable.
//
// Why not absl::Mutex itself: Debian ships abseil pre-built without ThreadSanitizer, so TSan
// cannot see absl::Mutex synchronise and reports every guarded access as a race. pthread
// mutexes and condition variables are intercepted by TSan, so this lock keeps `make test-tsan`
// meaningful. Thread-safe.
#ifndef CONNEX_BASE_MUTEX_H_
#define CONNEX_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace connex {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Waiters re-check their conditions whenever the lock is released, as with absl::Mutex. They
  // are woken before the unlock: once unlocked, the Mutex may already be destroyed by another
  // thread.
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    cv_.notify_all();
    mu_.unlock();
  }

  // Blocks until `cond` holds. The caller holds the lock, and holds it again on return.
  void Await(const absl::Condition& cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    if (cond.Eval()) return;
    // Waiting releases the lock without Unlock(): wake the other waiters here, since the caller
    // may have changed what they wait for (absl::Mutex re-checks them at this point too).
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv_.wait(lock, [&] { return cond.Eval(); });
    lock.release();
  }

  // As Await, for at most `timeout`; returns whether `cond` holds.
  bool AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    if (cond.Eval()) return true;
    cv_.notify_all();  // as in Await
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    bool held = cv_.wait_until(lock, deadline, [&] { return cond.Eval(); });
    lock.release();
    return held;
  }

  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

// Holds `mu` for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace connex

#endif  // CONNEX_BASE_MUTEX_H_
