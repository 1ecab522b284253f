#include "connex/engine/tokenizer.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace connex::engine {
namespace {

TEST(TokenizerTest, ArbitraryBytesRoundTrip) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(rng() % 300, '\0');
    for (char& c : text) c = static_cast<char>(rng() & 0xff);
    std::vector<int32_t> tokens = Tokenize(text, /*add_bos=*/true);
    ASSERT_EQ(tokens.size(), text.size() + 1);
    EXPECT_EQ(tokens[0], kBosToken);
    for (int32_t t : tokens) EXPECT_TRUE(t >= 0 && t < kByteVocab);
    EXPECT_EQ(Detokenize(tokens), text);
    EXPECT_EQ(Tokenize(Detokenize(tokens), true), tokens);
  }
}

TEST(TokenizerTest, Utf8AndSpecialTokens) {
  std::string text = "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80";
  std::vector<int32_t> tokens = Tokenize(text, /*add_bos=*/false);
  EXPECT_EQ(tokens.size(), text.size());
  EXPECT_EQ(tokens[1], 0xc3);
  tokens.insert(tokens.begin() + 3, kEosToken);
  tokens.push_back(kBosToken);
  tokens.push_back(100000);  // out of range: ignored
  EXPECT_EQ(Detokenize(tokens), text);
}

}  // namespace
}  // namespace connex::engine
