// Reading pp_test_node's owner output (one JSON line per finished request, then a `done` line
// with its counters), shared by the process tests that check its tokens.
#ifndef CONNEX_TESTS_PP_OWNER_OUTPUT_H_
#define CONNEX_TESTS_PP_OWNER_OUTPUT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "connex/base/subprocess.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::testing {

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

}  // namespace connex::testing

#endif  // CONNEX_TESTS_PP_OWNER_OUTPUT_H_
