#include "connex/base/logging.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace connex
