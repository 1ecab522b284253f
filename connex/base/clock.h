// Clock: a monotonic time source, injected so that leases and timeouts can be tested with a
// fake clock. RealClock and FakeClock are thread-safe.
#ifndef CONNEX_BASE_CLOCK_H_
#define CONNEX_BASE_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace connex {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic milliseconds since an arbitrary origin.
  virtual int64_t NowMs() const = 0;
};

// steady_clock.
class RealClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // A process-wide instance (stateless, so not a mutable global).
  static Clock* Get() {
    static RealClock clock;
    return &clock;
  }
};

// A clock that moves only when told to.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_.load(); }
  void AdvanceMs(int64_t ms) { now_ms_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace connex

#endif  // CONNEX_BASE_CLOCK_H_
