// WorkQueue<Item>: what one loop thread takes, posted from any thread, in order — a StageNode's
// frames, peer-set changes and commands. It is closed once, when the loop stops, and queues
// nothing after that; an item that needs the loop to answer it (a command) is refused until the
// loop started. Thread-safe.
#ifndef CONNEX_PP_INTERNAL_WORK_QUEUE_H_
#define CONNEX_PP_INTERNAL_WORK_QUEUE_H_

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "connex/base/mutex.h"

namespace connex::pp::internal {

template <typename Item>
class WorkQueue {
 public:
  // Queues `item` unless the queue is closed; false when it was dropped.
  bool Push(Item item) {
    connex::MutexLock lock(&mu_);
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }
  // Queues `item` only while a loop runs to take it (after LoopStarted, before Close).
  bool PushToLoop(Item item) {
    connex::MutexLock lock(&mu_);
    if (closed_ || !loop_started_) return false;
    items_.push_back(std::move(item));
    return true;
  }
  void LoopStarted() {
    connex::MutexLock lock(&mu_);
    loop_started_ = true;
  }
  // Waits up to `timeout` for an item, then takes every item queued (none after a timeout).
  std::deque<Item> Take(absl::Duration timeout) {
    std::deque<Item> taken;
    connex::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !items_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    taken.swap(items_);
    return taken;
  }
  // Takes every item queued now, without waiting (what is left once the loop stopped).
  std::deque<Item> TakeAll() { return Take(absl::ZeroDuration()); }
  // Closes the queue; false when it was closed already.
  bool Close() {
    connex::MutexLock lock(&mu_);
    if (closed_) return false;
    closed_ = true;
    return true;
  }
  bool closed() {
    connex::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  connex::Mutex mu_;
  std::deque<Item> items_ ABSL_GUARDED_BY(mu_);
  bool loop_started_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace connex::pp::internal

#endif  // CONNEX_PP_INTERNAL_WORK_QUEUE_H_
