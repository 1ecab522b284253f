#include "connex/base/lid.h"

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex {
namespace {

using ::testing::HasSubstr;

TEST(LidTest, PrintsAndParsesRoundTrip) {
  Lid lid{"llama-3.8b_v1", 1, 0, 7};
  EXPECT_EQ(lid.ToString(), "llama-3.8b_v1/g1/s0/r7");
  absl::StatusOr<Lid> parsed = Lid::Parse(lid.ToString());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, lid);
}

TEST(LidTest, ParsesLargestIndex) {
  absl::StatusOr<Lid> parsed = Lid::Parse("m/g4294967295/s0/r0");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->group, 4294967295u);
}

struct BadLid {
  const char* text;
  const char* message;
};

class LidParseErrorTest : public ::testing::TestWithParam<BadLid> {};

TEST_P(LidParseErrorTest, NamesWhatIsWrong) {
  absl::StatusOr<Lid> parsed = Lid::Parse(GetParam().text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, LidParseErrorTest,
    ::testing::Values(BadLid{"", "expected 4 parts"}, BadLid{"demo/g1/s0", "found 3"},
                      BadLid{"demo/g1/s0/r1/x", "found 5"},
                      BadLid{"/g1/s0/r1", "model name is empty"},
                      BadLid{"de mo/g1/s0/r1", "contains ' '"},
                      BadLid{"demo/x1/s0/r1", "expected 'g<number>' but found 'x1'"},
                      BadLid{"demo/g/s0/r1", "expected 'g<number>'"},
                      BadLid{"demo/g1/s-1/r1", "'s-1' is not 's' followed by a decimal number"},
                      BadLid{"demo/g1/s0/r1a", "'r1a' is not 'r'"},
                      BadLid{"demo/g4294967296/s0/r1", "out of range"},
                      BadLid{"demo/g99999999999999/s0/r1", "out of range"}));

TEST(LidTest, OrdersAndHashes) {
  Lid a{"m", 1, 0, 0};
  Lid b{"m", 1, 0, 1};
  EXPECT_LT(a, b);
  absl::flat_hash_set<Lid> set{a, b, a};
  EXPECT_EQ(set.size(), 2u);
}

TEST(LidTest, RejectsOverlongModel) {
  std::string model(Lid::kMaxModelLength + 1, 'm');
  absl::StatusOr<Lid> parsed = Lid::Parse(model + "/g0/s0/r0");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("limit is 128"));
}

}  // namespace
}  // namespace connex
