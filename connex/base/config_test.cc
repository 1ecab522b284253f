#include "connex/base/config.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, EnvIntDefaultsParsesAndRejects) {
  unsetenv("CONNEX_TEST_INT");
  EXPECT_EQ(*EnvInt("CONNEX_TEST_INT", 42, 0, 100), 42);
  setenv("CONNEX_TEST_INT", "7", 1);
  EXPECT_EQ(*EnvInt("CONNEX_TEST_INT", 42, 0, 100), 7);
  setenv("CONNEX_TEST_INT", "seven", 1);
  absl::StatusOr<int64_t> bad = EnvInt("CONNEX_TEST_INT", 42, 0, 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("CONNEX_TEST_INT='seven' is not an integer"));
  setenv("CONNEX_TEST_INT", "1000", 1);
  bad = EnvInt("CONNEX_TEST_INT", 42, 0, 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("out of range [0, 100]"));
  unsetenv("CONNEX_TEST_INT");
}

TEST(ConfigTest, EnvBool) {
  setenv("CONNEX_TEST_BOOL", "Yes", 1);
  EXPECT_TRUE(*EnvBool("CONNEX_TEST_BOOL", false));
  setenv("CONNEX_TEST_BOOL", "off", 1);
  EXPECT_FALSE(*EnvBool("CONNEX_TEST_BOOL", true));
  setenv("CONNEX_TEST_BOOL", "maybe", 1);
  EXPECT_FALSE(EnvBool("CONNEX_TEST_BOOL", true).ok());
  unsetenv("CONNEX_TEST_BOOL");
}

TEST(ConfigTest, ParseSize) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("4K"), 4096u);
  EXPECT_EQ(*ParseSize("64KiB"), 65536u);
  EXPECT_EQ(*ParseSize("16M"), 16u << 20);
  EXPECT_EQ(*ParseSize("1G"), 1u << 30);
  EXPECT_THAT(ParseSize("12Q").status().message(), HasSubstr("unknown suffix 'Q'"));
  EXPECT_THAT(ParseSize("K").status().message(), HasSubstr("does not start with a number"));
  EXPECT_FALSE(ParseSize("99999999999999999G").ok());
}

}  // namespace
}  // namespace connex
