// Reading pp_test_node's owner output (one JSON line per finished request, then a `done` line
// with its counters), shared by the process tests that check its tokens.
#ifndef CONNEX_TESTS_PP_OWNER_OUTPUT_H_
#define CONNEX_TESTS_PP_OWNER_OUTPUT_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "connex/base/subprocess.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/sanitized.h"

namespace connex::testing {

// Tokens per request of the outage tests' 4 requests: enough that they still stream when the
// directory (or every etcd member) comes back after its few seconds down, at this build's speed:
// about 2,000 tokens a second over the 4 in the default tree, ~1,600 under TSan, ~400 under ASan
// (where 6,000 kept a test running for a minute after the outage).
constexpr int kOutageMaxNewTokens = kAddressSanitized ? 1500 : 6000;

// Reads `owner`'s output until its `done` line (or `timeout_ms`, or its exit); checks that no
// request ended in an error and that every request's tokens equal `reference(id)`, and that
// `requests` requests finished. Returns the `done` line ("" when none came).
inline std::string CheckOwnerOutput(
    Subprocess& owner, int requests, int64_t timeout_ms,
    const std::function<std::vector<int32_t>(uint64_t)>& reference) {
  int seen = 0;
  std::string done;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    auto line = owner.ReadLine(1000);
    if (!line) {
      if (owner.Wait(0).has_value()) break;
      continue;
    }
    if (line->rfind("done", 0) == 0) {
      done = *line;
      break;
    }
    if (line->empty() || (*line)[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(*line);
    uint64_t id = j["id"];
    EXPECT_FALSE(j.contains("error")) << *line;
    if (j.contains("tokens")) {
      std::vector<int32_t> got = j["tokens"];
      EXPECT_EQ(got, reference(id)) << "request " << id;
    }
    ++seen;
  }
  EXPECT_EQ(seen, requests) << owner.transcript();
  EXPECT_FALSE(done.empty()) << owner.transcript();
  return done;
}

// CLOCK_MONOTONIC in microseconds: the clock of pp_test_node's streamed `t_us` (comparable across
// the processes of a host).
inline int64_t MonotonicNowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The output of an owner started with `--stream`: a line per token with its time, a line per
// finished request, then `done`.
class StreamedOwnerOutput {
 public:
  explicit StreamedOwnerOutput(Subprocess& owner) : owner_(owner) {}

  // Reads one line (false when none came within `timeout_ms`); a request that ended in an error
  // fails the test.
  bool ReadLine(int64_t timeout_ms) {
    std::optional<std::string> line = owner_.ReadLine(timeout_ms);
    if (!line) return false;
    if (line->rfind("done", 0) == 0) done_ = *line;
    if (line->empty() || (*line)[0] != '{') return true;
    nlohmann::json j = nlohmann::json::parse(*line);
    EXPECT_FALSE(j.contains("error")) << *line;
    if (j.contains("t_us")) token_us_.push_back(j["t_us"].get<int64_t>());
    if (j.contains("tokens")) {
      finished_[j["id"].get<uint64_t>()] = j["tokens"].get<std::vector<int32_t>>();
    }
    return true;
  }
  // Reads until `condition` holds or `timeout_ms` passed; whether it holds.
  template <typename Condition>
  bool ReadUntil(Condition condition, int64_t timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!condition() && std::chrono::steady_clock::now() < deadline) ReadLine(100);
    return condition();
  }
  // Reads for `ms` (a fault's duration), whatever comes.
  void ReadFor(int64_t ms) {
    const int64_t until = MonotonicNowUs() + ms * 1000;
    while (MonotonicNowUs() < until) ReadLine(20);
  }

  size_t tokens() const { return token_us_.size(); }
  const std::string& done() const { return done_; }
  const std::map<uint64_t, std::vector<int32_t>>& finished() const { return finished_; }
  // Tokens streamed in [from_us, to_us).
  int64_t TokensBetween(int64_t from_us, int64_t to_us) const {
    int64_t n = 0;
    for (int64_t t : token_us_) n += t >= from_us && t < to_us;
    return n;
  }
  // The longest time between two consecutive tokens (of any request).
  int64_t LongestGapUs() const {
    std::vector<int64_t> sorted = token_us_;
    std::sort(sorted.begin(), sorted.end());
    int64_t longest = 0;
    for (size_t i = 1; i < sorted.size(); ++i)
      longest = std::max(longest, sorted[i] - sorted[i - 1]);
    return longest;
  }

 private:
  Subprocess& owner_;
  std::vector<int64_t> token_us_;
  std::map<uint64_t, std::vector<int32_t>> finished_;
  std::string done_;
};

}  // namespace connex::testing

#endif  // CONNEX_TESTS_PP_OWNER_OUTPUT_H_
