// LoopBaton: which of a StageNode's two loop threads runs its loop (leader/followers). The
// loop's state is the leader's alone. A leader about to block on a peer (a step payload's
// one-sided read) runs that call through Blocking; should it last longer than `take_over_ms`,
// the follower takes the loop over, and the old leader, once its call returned, hands what it
// got to the loop as a work item and follows. The common case costs two uncontended locks and
// no thread hop: the follower polls (a futex wake per read would cost more on a busy machine
// than the read), and only a call that hangs — a peer whose host went down holds a tcp read
// until the transport suspects it, 1 s — moves the loop to the other thread.
//
// Why: a read of a lost peer on the loop froze every other step of the stage and its answers
// to probes; a host lost whole stalled the surviving stage of the other chain 1.2 s, and its
// owner once evicted it as silent (docs/results.md, "Several hosts"). Handing every read to a
// worker thread avoided that but added two thread hops per step: 15 % more end-to-end latency in
// `connex-chaos steady` on this 2-core machine.
// Thread-safe.
#ifndef CONNEX_PP_INTERNAL_LOOP_BATON_H_
#define CONNEX_PP_INTERNAL_LOOP_BATON_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "connex/base/mutex.h"

namespace connex::pp::internal {

class LoopBaton {
 public:
  explicit LoopBaton(int64_t take_over_ms) : take_over_ms_(take_over_ms) {}

  // The calling thread leads (the loop's first thread, before it runs the loop).
  void Lead();
  // Whether the calling thread leads now.
  bool Leads();
  // Runs `call` (the leader's, blocking). True: the caller still leads after it; false: the
  // follower took the loop over meanwhile — the caller must not touch the loop's state again
  // (it hands its results over through the loop's queue) and then follows (Follow).
  bool Blocking(const std::function<void()>& call);
  // A follower's wait: until the leader has been in Blocking longer than take_over_ms (true:
  // the caller leads now) or `stop` is set (false). Polls every take_over_ms / 2, at most every
  // 25 ms.
  bool Follow(const std::atomic<bool>& stop);

  // How often the loop moved to the other thread.
  uint64_t take_overs() const { return take_overs_.load(); }

 private:
  const int64_t take_over_ms_;
  connex::Mutex mu_;
  std::thread::id leader_ ABSL_GUARDED_BY(mu_);
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;       // the leader is in Blocking
  int64_t blocked_at_ms_ ABSL_GUARDED_BY(mu_) = 0;  // since when (steady clock)
  std::atomic<uint64_t> take_overs_{0};
};

}  // namespace connex::pp::internal

#endif  // CONNEX_PP_INTERNAL_LOOP_BATON_H_
