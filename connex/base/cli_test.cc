#include "connex/base/cli.h"

#include <string>
#include <vector>

#include "connex/base/logging.h"
#include "connex/base/logging_spdlog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex {
namespace {

using ::testing::HasSubstr;

// Runs ParseFlags over `args` (argv[0] is added); captures what CLI11 prints.
struct Parsed {
  std::optional<int> exit;
  std::string out;
};
Parsed Parse(connex::cli::App& app, std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  Parsed p;
  p.exit = ParseFlags(app, static_cast<int>(argv.size()), argv.data());
  p.out = ::testing::internal::GetCapturedStdout();
  p.out += ::testing::internal::GetCapturedStderr();
  return p;
}

TEST(CliTest, LogLevelAppliesTheFlagThenTheDefault) {
  {
    connex::cli::App app;
    AddLogLevelFlag(app, "warn");
    Parsed p = Parse(app, {"--log-level", "debug"});
    EXPECT_EQ(p.exit, std::nullopt) << p.out;
    EXPECT_EQ(Log().level(), spdlog::level::debug);
  }
  {
    connex::cli::App app;
    AddLogLevelFlag(app, "error");
    Parsed p = Parse(app, {});
    EXPECT_EQ(p.exit, std::nullopt) << p.out;
    EXPECT_EQ(Log().level(), spdlog::level::err);
  }
}

TEST(CliTest, BogusLogLevelIsAUsageErrorNamingTheAcceptedNames) {
  connex::cli::App app;
  AddLogLevelFlag(app);
  Log().set_level(spdlog::level::info);
  Parsed p = Parse(app, {"--log-level", "bogus"});
  EXPECT_EQ(p.exit, kUsageExitCode);
  EXPECT_THAT(p.out, HasSubstr("--log-level"));
  EXPECT_THAT(p.out, HasSubstr(kLogLevelNames));
  EXPECT_EQ(Log().level(), spdlog::level::info);  // not silently off
}

TEST(CliTest, HelpExitsZeroAndErrorsExitTwo) {
  connex::cli::App app;
  int n = 0;
  app.add_option("--n", n)->check(connex::cli::Range(1, 5));
  EXPECT_EQ(Parse(app, {"--help"}).exit, 0);
  connex::cli::App other;
  other.add_option("--n", n)->check(connex::cli::Range(1, 5));
  Parsed range = Parse(other, {"--n", "0"});
  EXPECT_EQ(range.exit, kUsageExitCode);
  EXPECT_THAT(range.out, HasSubstr("--n"));
  connex::cli::App third;
  Parsed unknown = Parse(third, {"--nope"});
  EXPECT_EQ(unknown.exit, kUsageExitCode);
}

TEST(CliTest, SizeRangeNamesTheValueAndTheLimit) {
  std::string sizes;
  connex::cli::App app;
  app.add_option("--sizes", sizes)->check(SizeRange(1, 1 << 20, /*list=*/true));
  EXPECT_EQ(Parse(app, {"--sizes", "4K,1M"}).exit, std::nullopt);
  EXPECT_EQ(sizes, "4K,1M");
  for (const char* bad : {"4K,2M", "0", "1X", "100G"}) {
    connex::cli::App a;
    a.add_option("--sizes", sizes)->check(SizeRange(1, 1 << 20, /*list=*/true));
    Parsed p = Parse(a, {"--sizes", bad});
    EXPECT_EQ(p.exit, kUsageExitCode) << bad;
    EXPECT_THAT(p.out, HasSubstr("--sizes")) << bad;
  }
  connex::cli::App a;
  a.add_option("--size", sizes)->check(SizeRange(1, 1 << 20));
  Parsed p = Parse(a, {"--size", "2M"});
  EXPECT_EQ(p.exit, kUsageExitCode);
  EXPECT_THAT(p.out, HasSubstr("2M (2097152 bytes) is outside the limits [1, 1048576]"));
}

}  // namespace
}  // namespace connex
