#include "connex/serving/stop_strings.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace connex::serving {
namespace {

TEST(ScanForStopTest, FindsTheEarliestStop) {
  std::vector<std::string> stops = {"END", "\n\n", "b"};
  StopScan scan = ScanForStop("hello\n\nworld END", stops);
  ASSERT_TRUE(scan.stop_at.has_value());
  EXPECT_EQ(*scan.stop_at, 5u);
  EXPECT_EQ(scan.safe_length, 5u);
  // "ab" starts before "b": the earliest start wins, whatever the order of the list.
  scan = ScanForStop("xab", std::vector<std::string>{"b", "ab"});
  EXPECT_EQ(scan.stop_at, 1u);
  // Matches before `from` were already streamed and do not count.
  scan = ScanForStop("b..b", stops, 1);
  EXPECT_EQ(scan.stop_at, 3u);
}

TEST(ScanForStopTest, HoldsBackAPossibleStart) {
  std::vector<std::string> stops = {"STOP"};
  EXPECT_EQ(ScanForStop("abc ST", stops).safe_length, 4u);
  EXPECT_EQ(ScanForStop("abc S", stops).safe_length, 4u);
  EXPECT_EQ(ScanForStop("abc STO", stops).safe_length, 4u);
  EXPECT_EQ(ScanForStop("abc SX", stops).safe_length, 6u);
  EXPECT_FALSE(ScanForStop("abc STO", stops).stop_at.has_value());
  // The longest held suffix over all stops.
  EXPECT_EQ(ScanForStop("xxaab", std::vector<std::string>{"aabc", "bz"}).safe_length, 2u);
  EXPECT_EQ(ScanForStop("plain text", {}).safe_length, 10u);
}

TEST(ScanForStopTest, NeverCutsAUtf8Character) {
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, three bytes
  EXPECT_EQ(CompleteUtf8Prefix("a" + euro), 4u);
  EXPECT_EQ(CompleteUtf8Prefix("a" + euro.substr(0, 2)), 1u);
  EXPECT_EQ(CompleteUtf8Prefix("a" + euro.substr(0, 1)), 1u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3"), 1u);      // first of two bytes
  EXPECT_EQ(CompleteUtf8Prefix("a\xC3\xA9"), 3u);  // é
  EXPECT_EQ(CompleteUtf8Prefix("a\x80\x80\x80\x80"),
            5u);  // stray continuations: nothing to wait for
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
  EXPECT_EQ(ScanForStop("ok" + euro.substr(0, 2), {}).safe_length, 2u);
}

TEST(StopStringFilterTest, StreamsTokenByTokenAndStopsAcrossTokens) {
  StopStringFilter filter({"</s>"});
  std::string streamed;
  for (std::string piece : {"Hel", "lo <", "/", "s> never"}) streamed += filter.Append(piece);
  EXPECT_TRUE(filter.stopped());
  EXPECT_EQ(streamed, "Hello ");
  EXPECT_EQ(filter.output(), "Hello ");
  EXPECT_EQ(filter.Append("more"), "");
  EXPECT_EQ(filter.Finish(), "");
}

TEST(StopStringFilterTest, HeldTextIsReleasedWhenItTurnsOutHarmless) {
  StopStringFilter filter({"</s>"});
  EXPECT_EQ(filter.Append("a <"), "a ");
  EXPECT_EQ(filter.Append("/"), "");
  EXPECT_EQ(filter.Append("x"), "</x");
  EXPECT_EQ(filter.Append(" <"), " ");
  EXPECT_FALSE(filter.stopped());
  EXPECT_EQ(filter.Finish(), "<");  // generation ended (length): the held text goes out
  EXPECT_EQ(filter.output(), "a </x <");
}

TEST(StopStringFilterTest, ByteByByteUtf8) {
  StopStringFilter filter({});
  const std::string text = "\xC3\xA9t\xC3\xA9";  // été
  std::vector<std::string> chunks;
  for (char c : text) chunks.push_back(filter.Append(std::string(1, c)));
  EXPECT_EQ(chunks, (std::vector<std::string>{"", "\xC3\xA9", "t", "", "\xC3\xA9"}));
}

}  // namespace
}  // namespace connex::serving
