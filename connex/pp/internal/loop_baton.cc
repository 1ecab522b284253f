#include "connex/pp/internal/loop_baton.h"

#include <algorithm>
#include <chrono>

#include "connex/base/check.h"

namespace connex::pp::internal {
namespace {

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void LoopBaton::Lead() {
  connex::MutexLock lock(&mu_);
  leader_ = std::this_thread::get_id();
  blocked_ = false;
}

bool LoopBaton::Leads() {
  connex::MutexLock lock(&mu_);
  return leader_ == std::this_thread::get_id();
}

bool LoopBaton::Blocking(const std::function<void()>& call) {
  const std::thread::id self = std::this_thread::get_id();
  {
    connex::MutexLock lock(&mu_);
    CONNEX_CHECK(leader_ == self && !blocked_);  // only the leader blocks, once at a time
    blocked_ = true;
    blocked_at_ms_ = SteadyMs();
  }
  call();
  connex::MutexLock lock(&mu_);
  if (leader_ != self) return false;  // taken over: `blocked_` is the new leader's now
  blocked_ = false;
  return true;
}

bool LoopBaton::Follow(const std::atomic<bool>& stop) {
  const std::thread::id self = std::this_thread::get_id();
  // Half the take-over time, at most 25 ms: `stop` is seen within 25 ms whatever the setting.
  const auto poll = std::chrono::milliseconds(std::clamp<int64_t>(take_over_ms_ / 2, 1, 25));
  while (!stop.load()) {
    {
      connex::MutexLock lock(&mu_);
      CONNEX_CHECK(leader_ != self);
      if (blocked_ && SteadyMs() - blocked_at_ms_ >= take_over_ms_) {
        leader_ = self;
        blocked_ = false;
        take_overs_.fetch_add(1);
        return true;
      }
    }
    std::this_thread::sleep_for(poll);
  }
  return false;
}

}  // namespace connex::pp::internal
