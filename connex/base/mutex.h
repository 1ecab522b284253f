// Mutex, SharedMutex and their scoped locks: std::mutex / std::shared_mutex with abseil's
// thread-safety annotations (clang -Wthread-safety) and absl::Mutex-style Await. Why not
// absl::Mutex: Debian's libabsl is not built with ThreadSanitizer, so TSan cannot see its
// synchronisation (every guarded access and every Condition evaluated by an unlocker shows up
// as a race); pthread mutexes and condition variables are intercepted by TSan. Thread-safe.
#ifndef CONNEX_BASE_MUTEX_H_
#define CONNEX_BASE_MUTEX_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace connex {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Wakes the threads in Await, which re-check their conditions (as absl::Mutex does).
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_.unlock();
    if (waiters_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // Waits, releasing the mutex meanwhile, until `cond()` (evaluated with the mutex held) is true.
  template <typename Cond>
  void Await(Cond cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    if (cond()) return;
    waiters_.fetch_add(1, std::memory_order_acq_rel);
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv_.wait(lock, cond);
    lock.release();
    waiters_.fetch_sub(1, std::memory_order_acq_rel);
  }
  // Like Await, for at most `timeout`; returns cond().
  template <typename Cond>
  bool AwaitWithTimeout(Cond cond, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    if (cond()) return true;
    waiters_.fetch_add(1, std::memory_order_acq_rel);
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    bool ok = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), cond);
    lock.release();
    waiters_.fetch_sub(1, std::memory_order_acq_rel);
    return ok;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> waiters_{0};
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A reader-writer lock (no Await).
class ABSL_LOCKABLE SharedMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class ABSL_SCOPED_LOCKABLE WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace connex

#endif  // CONNEX_BASE_MUTEX_H_
