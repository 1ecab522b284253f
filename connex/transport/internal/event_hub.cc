#include "connex/transport/internal/event_hub.h"

#include <utility>
#include <vector>

namespace connex::transport::internal {

EventHub::EventHub() : thread_([this] { Run(); }) {}

EventHub::~EventHub() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

uint64_t EventHub::Subscribe(PeerEventCallback cb) {
  MutexLock lock(&mu_);
  uint64_t id = next_id_++;
  subscribers_.emplace(id, std::make_shared<PeerEventCallback>(std::move(cb)));
  return id;
}

void EventHub::Unsubscribe(uint64_t id) {
  // 0 is never a subscription (ids start at 1), and running_id_ is 0 while no callback runs:
  // waiting for "not running 0" would wait for ever (issue 9, finding 7).
  if (id == 0) return;
  MutexLock lock(&mu_);
  subscribers_.erase(id);
  if (std::this_thread::get_id() == thread_.get_id()) return;
  auto not_running = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_id_ != id; };
  mu_.Await(absl::Condition(&not_running));
}

void EventHub::Publish(PeerEvent event) {
  MutexLock lock(&mu_);
  if (stop_) return;
  queue_.push_back(std::move(event));
  ++published_;
}

void EventHub::Flush() {
  MutexLock lock(&mu_);
  uint64_t target = published_;
  auto done = [this, target]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return delivered_ >= target || stop_; };
  mu_.Await(absl::Condition(&done));
}

void EventHub::Run() {
  MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
    mu_.Await(absl::Condition(&ready));
    if (stop_) return;
    PeerEvent event = std::move(queue_.front());
    queue_.pop_front();
    std::vector<std::pair<uint64_t, std::shared_ptr<PeerEventCallback>>> targets(
        subscribers_.begin(), subscribers_.end());
    for (auto& [id, cb] : targets) {
      if (subscribers_.find(id) == subscribers_.end()) continue;  // unsubscribed meanwhile
      running_id_ = id;
      mu_.Unlock();
      (*cb)(event);
      mu_.Lock();
      running_id_ = 0;
    }
    ++delivered_;
  }
}

}  // namespace connex::transport::internal
