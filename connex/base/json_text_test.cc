#include "connex/base/json_text.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex {
namespace {

using ::testing::HasSubstr;

TEST(JsonTextTest, ParsesWholeValuesAndDiscardsTheRest) {
  EXPECT_EQ(ParseJson(R"({"a": [1, 2]})")["a"][1], 2);
  EXPECT_TRUE(ParseJson("{\"a\": 1").is_discarded());
  EXPECT_TRUE(ParseJson("1 2").is_discarded()) << "one whole value, nothing after it";
  EXPECT_TRUE(ParseJson("").is_discarded());
  nlohmann::ordered_json ordered = ParseOrderedJson(R"({"z": 1, "a": 2})");
  EXPECT_EQ(ordered.begin().key(), "z") << "ordered_json keeps the text's order";
  EXPECT_TRUE(ParseOrderedJson("nul").is_discarded());
}

TEST(JsonTextTest, CheckedParsingNamesWhatIsWrong) {
  absl::StatusOr<nlohmann::json> bad = ParseJsonChecked("{\"a\": tru}");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("line 1, column"));
  const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
  absl::StatusOr<nlohmann::json> too_deep = ParseJsonChecked(deep, 64);
  ASSERT_FALSE(too_deep.ok());
  EXPECT_TRUE(absl::IsOutOfRange(too_deep.status()));
  EXPECT_THAT(too_deep.status().message(), HasSubstr("deeper than 64 levels"));
  absl::StatusOr<nlohmann::json> fits = ParseJsonChecked("[[[1]]]", 3);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ((*fits)[0][0][0], 1);
}

TEST(JsonTextTest, DumpingNeverThrowsOnBadUtf8) {
  nlohmann::json j = {{"text", std::string("a\xff") + "b"}};
  EXPECT_EQ(DumpJson(j),
            "{\"text\":\"a\xef\xbf\xbd"
            "b\"}");  // U+FFFD
  EXPECT_EQ(DumpJson(nlohmann::json::array({1, 2}), 2), "[\n  1,\n  2\n]");
  nlohmann::ordered_json o = {{"z", 1}, {"a", 2}};
  EXPECT_EQ(DumpJson(o), R"({"z":1,"a":2})");
}

}  // namespace
}  // namespace connex
