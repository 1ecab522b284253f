#include "connex/base/logging.h"

#include "connex/base/access_log.h"
#include "connex/base/logging_spdlog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex {
namespace {

using ::testing::HasSubstr;

TEST(LoggingTest, ParsesEveryDocumentedLevel) {
  EXPECT_EQ(ParseLogLevel("trace").value(), spdlog::level::trace);
  EXPECT_EQ(ParseLogLevel("debug").value(), spdlog::level::debug);
  EXPECT_EQ(ParseLogLevel("info").value(), spdlog::level::info);
  EXPECT_EQ(ParseLogLevel("warn").value(), spdlog::level::warn);
  EXPECT_EQ(ParseLogLevel("error").value(), spdlog::level::err);
  EXPECT_EQ(ParseLogLevel("off").value(), spdlog::level::off);
}

TEST(LoggingTest, AnUnknownLevelIsAnErrorNotOff) {
  for (const char* bad : {"bogus", "", "INFO", "warning", "of"}) {
    absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel(bad);
    ASSERT_FALSE(level.ok()) << bad;
    EXPECT_EQ(level.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(level.status().message(), HasSubstr(kLogLevelNames));
  }
}

TEST(AccessLogTest, ALineIsKeyValuesInTextAndMembersInJson) {
  const std::string text = AccessLine(
      {{"id", "cmpl-7"}, {"status", 200}, {"latency_s", 0.25}, {"error", "bad \"x\" here"}},
      /*json=*/false);
  EXPECT_EQ(text, R"(access id=cmpl-7 status=200 latency_s=0.25 error="bad \"x\" here")");
  const std::string json =
      AccessLine({{"id", "cmpl-7"}, {"status", 200}, {"latency_s", 0.25}, {"error", "line\nbreak"}},
                 /*json=*/true);
  nlohmann::json parsed = nlohmann::json::parse("{" + json + "}");
  EXPECT_EQ(parsed["id"], "cmpl-7");
  EXPECT_EQ(parsed["status"], 200);
  EXPECT_DOUBLE_EQ(parsed["latency_s"].get<double>(), 0.25);
  EXPECT_EQ(parsed["error"], "line\nbreak");
}

}  // namespace
}  // namespace connex
