#include "connex/engine/internal/utf8.h"

#include <set>

#include "gtest/gtest.h"

namespace connex::engine::internal {
namespace {

constexpr std::string_view kFffd = "\xEF\xBF\xBD";

std::string Repeat(std::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(Utf8Test, FindsTheFirstIllFormedByte) {
  EXPECT_EQ(FindInvalidUtf8("plain ascii"), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("h\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("ab\xC3"), 2u);            // truncated
  EXPECT_EQ(FindInvalidUtf8("a\xC0\xAF"), 1u);         // overlong
  EXPECT_EQ(FindInvalidUtf8("a\xED\xA0\x80"), 1u);     // surrogate
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(FindInvalidUtf8("ok\x80"), 2u);            // lone continuation
}

// Each maximal subpart of an ill-formed sequence is one U+FFFD (the WHATWG decoder's rule).
TEST(Utf8Test, LossyDecodingReplacesMaximalSubparts) {
  EXPECT_EQ(DecodeUtf8Lossy("h\xC3\xA9"), "h\xC3\xA9");
  EXPECT_EQ(DecodeUtf8Lossy("\xE4\xB8"), kFffd);  // one truncated character
  EXPECT_EQ(DecodeUtf8Lossy("\xE4\xB8"
                            "A"),
            std::string(kFffd) + "A");
  EXPECT_EQ(DecodeUtf8Lossy("\xF0\x80\x80"), Repeat(kFffd, 3));  // F0 80: not a prefix
  EXPECT_EQ(DecodeUtf8Lossy("\xED\xA0\x80"), Repeat(kFffd, 3));  // surrogate
  EXPECT_EQ(DecodeUtf8Lossy("\xC0\xAF"), Repeat(kFffd, 2));
  EXPECT_EQ(DecodeUtf8Lossy("\xFF\xFE"), Repeat(kFffd, 2));
  EXPECT_EQ(DecodeUtf8Lossy("\xF0\x9F\x98"), kFffd);
}

TEST(Utf8Test, ByteOrderMarkIsKeptUnlessStrippedAtTheStart) {
  EXPECT_EQ(DecodeUtf8Lossy("\xEF\xBB\xBFx"), "\xEF\xBB\xBFx");
  EXPECT_EQ(DecodeUtf8Lossy("\xEF\xBB\xBFx", /*strip_bom=*/true), "x");
  EXPECT_EQ(DecodeUtf8Lossy("x\xEF\xBB\xBF", /*strip_bom=*/true), "x\xEF\xBB\xBF");
}

TEST(Utf8Test, CodePointsRoundTrip) {
  for (char32_t cp : {U'A', U'\u00E9', U'\u4E2D', U'\U0001F600', U'\U0010FFFF'}) {
    std::string s;
    AppendUtf8(cp, &s);
    size_t pos = 0;
    EXPECT_EQ(NextCodePoint(s, &pos), cp);
    EXPECT_EQ(pos, s.size());
  }
}

TEST(Utf8Test, JavaScriptTrimsItsWhiteSpaceOnly) {
  EXPECT_EQ(TrimJsStart(" \t\xE3\x80\x80x "), "x ");         // U+3000
  EXPECT_EQ(TrimJsEnd(" x\xEF\xBB\xBF\n"), " x");            // U+FEFF is white space
  EXPECT_EQ(TrimJsEnd("x\xC2\x85"), "x\xC2\x85");            // U+0085 is not
  EXPECT_EQ(TrimJsStart("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");  // nor U+200B
}

TEST(Utf8Test, ByteLevelAlphabetIsABijection) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    char32_t c = ByteToChar()[b];
    EXPECT_TRUE(seen.insert(c).second);
    EXPECT_EQ(CharToByte(c), b);
  }
  EXPECT_EQ(ByteToChar()['A'], U'A');
  EXPECT_EQ(ByteToChar()[' '], U'\u0120');   // "Ġ"
  EXPECT_EQ(ByteToChar()['\n'], U'\u010A');  // "Ċ"
  EXPECT_EQ(CharToByte(U'\u4E2D'), -1);
}

}  // namespace
}  // namespace connex::engine::internal
