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

TEST(ByteTokenizerTest, InterfaceMatchesTheFreeFunctions) {
  TokenizerPtr t = NewByteTokenizer();
  std::string text = "h\xc3\xa9llo <s>";
  EXPECT_EQ(*t->Encode(text, /*add_special_tokens=*/true), Tokenize(text, /*add_bos=*/true));
  EXPECT_EQ(*t->Encode(text, /*add_special_tokens=*/false), Tokenize(text, /*add_bos=*/false));
  std::vector<int32_t> ids = Tokenize(text, /*add_bos=*/true);
  ids.push_back(kEosToken);
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(*t->Decode(ids, skip), text);
  EXPECT_EQ(*t->Decode(ids, {}), "<s>" + text + "</s>");
  EXPECT_EQ(t->vocab_size(), kByteVocab);
  EXPECT_EQ(t->bos()->id, kBosToken);
  EXPECT_EQ(t->eos()->id, kEosToken);
  EXPECT_EQ(t->TokenId("</s>"), kEosToken);
  EXPECT_TRUE(t->IsSpecial(kBosToken));
  EXPECT_FALSE(t->IsSpecial('a'));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{kByteVocab}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Decode is valid UTF-8 (Detokenize stays lossless).
  std::vector<int32_t> bad = {'a', 0xC3};
  EXPECT_EQ(*t->Decode(bad, {}), "a\xEF\xBF\xBD");
  EXPECT_EQ(Detokenize(bad), "a\xC3");
}

// A character split across byte tokens comes out whole; an invalid byte comes out as U+FFFD once
// the next token shows that no character continues it; Flush ends an incomplete one.
TEST(ByteTokenizerTest, StreamEmitsWholeCharacters) {
  TokenizerPtr t = NewByteTokenizer();
  auto stream = t->NewStreamDecoder(/*skip_special_tokens=*/true);
  std::vector<std::string> chunks;
  for (int32_t id : std::vector<int32_t>{kBosToken, 'a', 0xE4, 0xB8, 0xAD, 0xFF, 'b', 0xF0, 0x9F}) {
    auto chunk = stream->Push(id);
    ASSERT_TRUE(chunk.ok());
    chunks.push_back(*chunk);
  }
  chunks.push_back(*stream->Flush());
  EXPECT_EQ(chunks, (std::vector<std::string>{"", "a", "", "", "\xE4\xB8\xAD", "",
                                              "\xEF\xBF\xBD"
                                              "b",
                                              "", "", "\xEF\xBF\xBD"}));
  EXPECT_EQ(stream->Push(-1).status().code(), absl::StatusCode::kInvalidArgument);
  // The decoder goes on after an error and after Flush.
  EXPECT_EQ(*stream->Push('c'), "c");
}

TEST(ByteTokenizerTest, RandomBytesStreamToDecode) {
  TokenizerPtr t = NewByteTokenizer();
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> ids(rng() % 40);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % kByteVocab);
    auto stream = t->NewStreamDecoder(false);
    std::string streamed;
    for (int32_t id : ids) streamed += *stream->Push(id);
    streamed += *stream->Flush();
    EXPECT_EQ(streamed, *t->Decode(ids, {}));
  }
}

TEST(ByteTokenizerTest, ModelDirectoryWithoutTokenizerJson) {
  auto t = LoadTokenizer(::testing::TempDir());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace connex::engine
