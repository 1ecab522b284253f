#pragma once

// One-sided reads: copying a peer's registered memory while its owner may be rewriting it.
//
// A TransferSyncRead is an RDMA-style read: the owner is not told, and nothing stops it from
// reusing the range mid-copy. The data plane does not prevent that (it cannot, on real
// hardware); the caller detects it. The step protocol does so with a seqlock: every ring slot
// starts with a header the owner invalidates before rewriting the payload, and the reader
// checks it again after the copy (connex/pp/send_ring.cc, ReadSlot). A torn copy is thrown
// away, never used.
//
// In-process data planes (mem, and shm between two engines of one test process) make that
// by-design race visible to ThreadSanitizer, which would report it as a bug. OneSidedCopy is
// the one place that copy happens, and the one place it is hidden from TSan; every other
// access, locks and atomics included, stays checked.

#include <cstddef>
#include <cstring>

#if defined(__SANITIZE_THREAD__)
#define CONNEX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CONNEX_TSAN 1
#endif
#endif

#ifdef CONNEX_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace connex::transport::internal {

// Copies `length` bytes of a peer's registered memory at `remote` to `local`. The bytes may be
// torn if the owner rewrites them concurrently; the caller must check (see above).
inline void OneSidedCopy(void* local, const void* remote, size_t length) {
#ifdef CONNEX_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  std::memcpy(local, remote, length);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#else
  std::memcpy(local, remote, length);
#endif
}

}  // namespace connex::transport::internal
