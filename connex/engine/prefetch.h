// A prefetch of the cache line holding `p` into every cache level (_mm_prefetch's _MM_HINT_T0),
// for the decode kernel's look-ahead and the reads that measure it (bench_engine --vs-bound).
// On x86 it is an asm statement: g++ 12 emitted none of the decode loop's 108
// __builtin_prefetch calls once their address depended on a branch (clang 14 kept them), and
// nothing failed but the speed. A prefetch never faults, whatever the address. Thread-safe.
#ifndef CONNEX_ENGINE_PREFETCH_H_
#define CONNEX_ENGINE_PREFETCH_H_

namespace connex::engine {

inline void PrefetchT0(const char* p) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ volatile("prefetcht0 %0" : : "m"(*p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_PREFETCH_H_
