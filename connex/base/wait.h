// WaitUntil: polls a condition until it holds or a deadline passes — the way tests and tools
// wait for something to happen (never a fixed sleep). Thread-safe (stateless).
#ifndef CONNEX_BASE_WAIT_H_
#define CONNEX_BASE_WAIT_H_

#include <chrono>
#include <cstdint>
#include <thread>

namespace connex {

// Returns true as soon as `condition()` is true, false if it is still false after `timeout_ms`.
template <typename Condition>
bool WaitUntil(Condition condition, int64_t timeout_ms, int64_t poll_ms = 2) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
}

}  // namespace connex

#endif  // CONNEX_BASE_WAIT_H_
