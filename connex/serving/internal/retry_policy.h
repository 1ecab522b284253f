// The resume proxy's retry rules for one request (connex/serving/proxy.cc): how many attempts it
// may make, how long an outage may last — from its first failure with no token delivered since,
// so every token delivered starts a new budget — and, after a failure or while no replica is up,
// whether to retry now (another replica is up: at once, the first time), wait (backing off from
// 50 ms to 1 s, or until a replica that is down comes back) or give up. It keeps the last failure
// for the final error and the replica that failed last, which the next pick avoids. No I/O and no
// clock of its own: `now` is passed in. Thread-compatible (the proxy's I/O thread).
#ifndef CONNEX_SERVING_INTERNAL_RETRY_POLICY_H_
#define CONNEX_SERVING_INTERNAL_RETRY_POLICY_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace connex::serving::internal {

inline constexpr int64_t kFirstBackoffMs = 50;
inline constexpr int64_t kMaxBackoffMs = 1'000;

class RetryPolicy {
 public:
  using Clock = std::chrono::steady_clock;

  RetryPolicy(int max_attempts, int64_t retry_budget_ms)
      : max_attempts_(max_attempts), retry_budget_ms_(retry_budget_ms) {}

  // Counts an attempt about to start; false (and not counted) when max_attempts were made.
  bool StartAttempt();
  int attempts() const { return attempts_; }

  // Tokens were delivered: the outage under way, if any, is over (and its backoff).
  void Progress();

  // The attempt on `replica` failed at `now` for `why` (which names the replica): the outage
  // begins unless one is under way; the next pick avoids `replica`.
  void Failed(Clock::time_point now, const std::string& replica, std::string why);
  // No replica is up at `now`: the outage begins, for `why`, unless one is under way.
  void NoReplica(Clock::time_point now, std::string why);

  // What to do after Failed or NoReplica: give up (out of attempts, or the outage's budget is
  // spent), retry now, or retry at `at` (or earlier, when the replica set changes).
  struct Decision {
    enum class Kind { kGiveUp, kRetryNow, kWait } kind;
    Clock::time_point at{};  // kWait
  };
  // `alternative`: a replica is up now; `next_up`: when the earliest replica that is down comes
  // back, if one does.
  Decision Next(Clock::time_point now, bool alternative, std::optional<Clock::time_point> next_up);

  // Why the request ends when Next gave up: the budget, the attempts, the last failure.
  std::string GiveUpReason() const;

  const std::string& avoid() const { return avoid_; }  // the replica that failed last
  const std::string& last_error() const { return last_error_; }

 private:
  const int max_attempts_;
  const int64_t retry_budget_ms_;
  int attempts_ = 0;
  std::optional<Clock::time_point> outage_deadline_;  // set by a failure, cleared by progress
  int64_t backoff_ms_ = 0;
  std::string avoid_;
  std::string last_error_;
};

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_RETRY_POLICY_H_
