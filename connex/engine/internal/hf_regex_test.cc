#include "connex/engine/internal/hf_regex.h"

#include "gtest/gtest.h"

namespace connex::engine::internal {
namespace {

std::vector<std::string> Matches(const Regex& re, std::string_view text) {
  auto matches = re.FindAll(text);
  EXPECT_TRUE(matches.ok()) << matches.status();
  std::vector<std::string> out;
  for (const auto& m : *matches) out.emplace_back(text.substr(m.begin, m.end - m.begin));
  return out;
}

using V = std::vector<std::string>;

// `\s` is JavaScript's: U+FEFF yes, U+0085 and U+180E no (PCRE2's UCP `\s` says the opposite).
TEST(HfRegexTest, WhiteSpaceIsJavaScripts) {
  auto re = Regex::Compile("\\s+");
  ASSERT_TRUE(re.ok()) << re.status();
  EXPECT_EQ(Matches(*re,
                    "a\xEF\xBB\xBF\xE3\x80\x80"
                    "b"),
            V{"\xEF\xBB\xBF\xE3\x80\x80"});
  EXPECT_EQ(Matches(*re,
                    "a\xC2\x85"
                    "b\xE1\xA0\x8E"
                    "c"),
            V{});
  auto not_space = Regex::Compile("[^\\s]+");
  ASSERT_TRUE(not_space.ok());
  EXPECT_EQ(Matches(*not_space, "x\xEF\xBB\xBFy"), (V{"x", "y"}));
  auto upper = Regex::Compile("\\S+");
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(Matches(*upper, "x\xC2\x85y z"), (V{"x\xC2\x85y", "z"}));
}

TEST(HfRegexTest, DigitsAndWordsAreAscii) {
  auto re = Regex::Compile("\\d+|\\w+");
  ASSERT_TRUE(re.ok());
  // U+0661 (Arabic-Indic one) and U+00E9 are neither.
  EXPECT_EQ(Matches(*re,
                    "12\xD9\xA1"
                    "ab\xC3\xA9"),
            (V{"12", "ab"}));
}

// The contraction group is ASCII-caseless: 'S yes, U+017F (long s) no.
TEST(HfRegexTest, ContractionsAreAsciiCaseless) {
  auto re = Regex::Compile("(?i:'s|'t|'re|'ve|'m|'ll|'d)");
  ASSERT_TRUE(re.ok()) << re.status();
  EXPECT_EQ(Matches(*re, "it'S we'Ll x'\xC5\xBF"), (V{"'S", "'Ll"}));
}

TEST(HfRegexTest, UnicodePropertiesAndLookahead) {
  auto re = Regex::Compile("\\p{L}+|\\p{N}{1,3}|\\s+(?!\\S)|\\s+");
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(Matches(*re, "h\xC3\xA9 12345   x"),
            (V{"h\xC3\xA9", " ", "123", "45", "  ", " ", "x"}));
}

TEST(HfRegexTest, EmptyMatchesStepOneCharacter) {
  auto re = Regex::Compile("x*");
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(Matches(*re, "\xE4\xB8\xADxx"), (V{"", "xx", ""}));
}

TEST(HfRegexTest, LiteralsAndReplace) {
  auto re = Regex::Literal("a.b");
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(*re->ReplaceAll("a.b axb a.b", "-"), "- axb -");
  auto js = Regex::Compile("\\u2581|\\u{20}");
  ASSERT_TRUE(js.ok()) << js.status();
  EXPECT_EQ(*js->ReplaceAll("a\xE2\x96\x81"
                            "b c",
                            "_"),
            "a_b_c");
}

TEST(HfRegexTest, RefusesWhatItCannotTranslate) {
  auto boundary = Regex::Compile("\\bword\\b");
  EXPECT_EQ(boundary.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(boundary.status().message().find("word boundary"), std::string::npos);
  auto bad = Regex::Compile("(unclosed");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
}

}  // namespace
}  // namespace connex::engine::internal
