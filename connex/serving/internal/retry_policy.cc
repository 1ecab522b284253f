#include "connex/serving/internal/retry_policy.h"

#include <algorithm>
#include <utility>

#include "connex/base/strings.h"

namespace connex::serving::internal {

bool RetryPolicy::StartAttempt() {
  if (attempts_ >= max_attempts_) return false;
  ++attempts_;
  return true;
}

void RetryPolicy::Progress() {
  outage_deadline_.reset();
  backoff_ms_ = 0;
}

void RetryPolicy::Failed(Clock::time_point now, const std::string& replica, std::string why) {
  avoid_ = replica;
  last_error_ = std::move(why);
  if (!outage_deadline_) outage_deadline_ = now + std::chrono::milliseconds(retry_budget_ms_);
}

void RetryPolicy::NoReplica(Clock::time_point now, std::string why) {
  if (outage_deadline_) return;
  outage_deadline_ = now + std::chrono::milliseconds(retry_budget_ms_);
  last_error_ = std::move(why);
}

RetryPolicy::Decision RetryPolicy::Next(Clock::time_point now, bool alternative,
                                        std::optional<Clock::time_point> next_up) {
  if (attempts_ >= max_attempts_ || (outage_deadline_ && now >= *outage_deadline_)) {
    return {Decision::Kind::kGiveUp};
  }
  if (alternative && backoff_ms_ == 0) {  // the first failure of an outage: another replica now
    backoff_ms_ = kFirstBackoffMs;
    return {Decision::Kind::kRetryNow};
  }
  backoff_ms_ = std::clamp(backoff_ms_ * 2, kFirstBackoffMs, kMaxBackoffMs);
  Clock::time_point at = now + std::chrono::milliseconds(backoff_ms_);
  if (next_up && *next_up > now && *next_up < at) at = *next_up;
  if (outage_deadline_ && *outage_deadline_ < at) at = *outage_deadline_;
  return {Decision::Kind::kWait, at};
}

std::string RetryPolicy::GiveUpReason() const {
  return StrCat("no replica completed the request within the retry budget (", retry_budget_ms_,
                " ms of outage, ", attempts_, " attempts made of ", max_attempts_,
                "); last: ", last_error_);
}

}  // namespace connex::serving::internal
