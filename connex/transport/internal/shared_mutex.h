// SharedMutex: a reader-writer lock on std::shared_mutex (visible to TSan, unlike Debian's
// uninstrumented absl::Mutex) with abseil's thread-safety annotations; see connex/base/mutex.h.
// Thread-safe.
#ifndef CONNEX_TRANSPORT_INTERNAL_SHARED_MUTEX_H_
#define CONNEX_TRANSPORT_INTERNAL_SHARED_MUTEX_H_

#include <shared_mutex>

#include "absl/base/thread_annotations.h"

namespace connex::transport::internal {

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

}  // namespace connex::transport::internal

#endif  // CONNEX_TRANSPORT_INTERNAL_SHARED_MUTEX_H_
