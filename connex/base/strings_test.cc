#include "connex/base/strings.h"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace connex {
namespace {

enum class Color { kRed, kBlue };

}  // namespace
}  // namespace connex

template <>
struct fmt::formatter<connex::Color> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(connex::Color c, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(c == connex::Color::kRed ? "red" : "blue", ctx);
  }
};

namespace connex {
namespace {

// StrCat writes each argument as fmt::format("{}", argument) would.
template <typename T>
void ExpectFmtText(const T& value) {
  EXPECT_EQ(StrCat(value), fmt::format("{}", value));
}

TEST(StrCatTest, IntegersOfEveryWidthAsFmtWritesThem) {
  ExpectFmtText(0);
  ExpectFmtText(-1);
  ExpectFmtText(std::numeric_limits<int8_t>::min());   // signed char: a number, not a character
  ExpectFmtText(std::numeric_limits<uint8_t>::max());  // unsigned char too
  ExpectFmtText(std::numeric_limits<int16_t>::min());
  ExpectFmtText(std::numeric_limits<uint16_t>::max());
  ExpectFmtText(std::numeric_limits<int32_t>::min());
  ExpectFmtText(std::numeric_limits<uint32_t>::max());
  ExpectFmtText(std::numeric_limits<int64_t>::min());
  ExpectFmtText(std::numeric_limits<int64_t>::max());
  ExpectFmtText(std::numeric_limits<uint64_t>::max());
  ExpectFmtText(size_t{42});
  ExpectFmtText(static_cast<long long>(-7));  // NOLINT(runtime/int): a distinct type from int64_t
  ExpectFmtText(static_cast<unsigned long long>(7));  // NOLINT(runtime/int)
}

TEST(StrCatTest, FloatingPointBoolAndCharAsFmtWritesThem) {
  for (double v :
       {0.0, -0.0, 1.5, 0.1, 100.0, 1e15, 1e16, 1e20, 1e-4, 1e-5, 123456.789,
        -2.2250738585072014e-308, std::numeric_limits<double>::max(),
        std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    ExpectFmtText(v);
  }
  for (float v : {0.1f, 1.5f, 3.4028235e38f, 1e-7f}) ExpectFmtText(v);  // float's shortest text
  EXPECT_EQ(StrCat(0.1f), "0.1");
  for (long double v : {0.1L, -1.5L, std::numeric_limits<long double>::max(),
                        std::numeric_limits<long double>::denorm_min()}) {
    ExpectFmtText(v);
  }
  ExpectFmtText(true);
  ExpectFmtText(false);
  ExpectFmtText('x');
}

// StrCat(nullptr) does not compile (it would have read address 0 as text).
static_assert(!std::is_constructible_v<internal::StrCatPiece, std::nullptr_t>);
static_assert(std::is_constructible_v<internal::StrCatPiece, const char*>);

TEST(StrCatTest, TextOfEveryKindIsJoinedAsItIs) {
  const std::string s = "string";
  const std::string_view sv = "view";
  const absl::string_view av = "absl";
  char mutable_chars[] = "chars";
  const char* c_string = "c-string";
  EXPECT_EQ(StrCat(s, "|", sv, "|", av, "|", mutable_chars, "|", c_string),
            "string|view|absl|chars|c-string");
  EXPECT_EQ(StrCat(), "");
  EXPECT_EQ(StrCat(std::string_view("with\0nul", 8)), std::string("with\0nul", 8));
}

TEST(StrCatTest, OtherTypesGoThroughTheirFormatter) {
  EXPECT_EQ(StrCat("color=", Color::kBlue, ", n=", 3, ", ok=", true), "color=blue, n=3, ok=true");
  int x = 0;
  ExpectFmtText(static_cast<const void*>(&x));
}

}  // namespace
}  // namespace connex
