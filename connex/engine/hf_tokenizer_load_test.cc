// HfTokenizer on small hand-written tokenizer.json files: the refusals (with the culprit named),
// and the pipelines the real families do not exercise (Metaspace, added-token stripping, no
// decoder).
#include <filesystem>

#include "connex/engine/hf_tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// A SentencePiece-style BPE: "▁hello" and "▁world" from merges, byte fallback for the rest.
json Tiny() {
  json vocab = {{"<unk>", 0}, {"<s>", 1},   {"\xE2\x96\x81", 2},
                {"h", 3},     {"e", 4},     {"l", 5},
                {"o", 6},     {"w", 7},     {"r", 8},
                {"d", 9},     {"he", 10},   {"ll", 11},
                {"hell", 12}, {"hello", 13}};
  vocab["\xE2\x96\x81hello"] = 14;
  vocab["\xE2\x96\x81w"] = 15;
  vocab["\xE2\x96\x81world"] = 16;
  vocab["or"] = 17;
  vocab["orld"] = 18;
  vocab["ld"] = 19;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 20 + b;
  }
  json merges = {"h e",
                 "l l",
                 "he ll",
                 "hell o",
                 "\xE2\x96\x81 hello",
                 "\xE2\x96\x81 w",
                 "o r",
                 "l d",
                 "or ld",
                 "\xE2\x96\x81w orld"};
  const std::string meta = "\xE2\x96\x81";
  json t;
  t["model"] = {{"type", "BPE"},         {"vocab", vocab},       {"merges", merges},
                {"byte_fallback", true}, {"unk_token", "<unk>"}, {"fuse_unk", true}};
  t["added_tokens"] = json::array();
  t["added_tokens"].push_back(
      {{"id", 1}, {"content", "<s>"}, {"special", true}, {"lstrip", false}, {"rstrip", false}});
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", "first"}, {"split", false}};
  t["post_processor"] = nullptr;
  json decoders = json::array();
  decoders.push_back({{"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", "first"}});
  decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  t["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  return t;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const json& tokenizer, const json& config = {}) {
  return HfTokenizer::FromJson(tokenizer.dump(), config.is_null() ? "" : config.dump(), "m");
}

void ExpectRefused(const json& tokenizer, const std::string& culprit, const json& config = {}) {
  auto t = Load(tokenizer, config);
  ASSERT_FALSE(t.ok()) << culprit;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(culprit), std::string::npos) << t.status();
}

TEST(HfTokenizerLoadTest, CorruptFilesAreRefusedNamingTheFile) {
  auto t = HfTokenizer::FromJson("{\"model\": [", "", "dir");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("dir/tokenizer.json: not valid JSON"), std::string::npos)
      << t.status();
  t = HfTokenizer::FromJson(Tiny().dump(), "{oops", "dir");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("dir/tokenizer_config.json"), std::string::npos);
  json no_vocab = Tiny();
  no_vocab["model"].erase("vocab");
  ExpectRefused(no_vocab, "model.vocab");
  json bad_id = Tiny();
  bad_id["model"]["vocab"]["h"] = "three";
  ExpectRefused(bad_id, "m/tokenizer.json");
  auto missing = LoadTokenizer("/nonexistent/model");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model/tokenizer.json"),
            std::string::npos);
}

TEST(HfTokenizerLoadTest, UnsupportedComponentsAreRefusedByType) {
  json t = Tiny();
  t["pre_tokenizer"] = {{"type", "Whitespace"}};
  ExpectRefused(t, "pre_tokenizer: type \"Whitespace\" is not supported");
  t = Tiny();
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Punctuation"}, {"behavior", "Isolated"}}}}};
  ExpectRefused(t, "type \"Punctuation\"");
  t = Tiny();
  t["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "\\s+"}}},
                        {"behavior", "MergedWithPrevious"},
                        {"invert", false}};
  ExpectRefused(t, "Split behavior \"MergedWithPrevious\"");
  t["pre_tokenizer"]["behavior"] = "Isolated";
  t["pre_tokenizer"]["pattern"] = {{"Glob", "*"}};
  ExpectRefused(t, "pre_tokenizer: pattern is neither");
  t["pre_tokenizer"]["pattern"] = {{"Regex", "(?<=a"}};
  ExpectRefused(t, "pre_tokenizer: regex \"(?<=a\"");
  t = Tiny();
  t["model"]["type"] = "Unigram";
  ExpectRefused(t, "model type \"Unigram\" is not supported");
  t = Tiny();
  t["normalizer"] = {{"type", "Lowercase"}};
  ExpectRefused(t, "normalizer: type \"Lowercase\"");
  t = Tiny();
  t["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
  ExpectRefused(t, "decoder: type \"WordPiece\"");
  t = Tiny();
  t["post_processor"] = {{"type", "RobertaProcessing"}};
  ExpectRefused(t, "post_processor: type \"RobertaProcessing\"");
  t = Tiny();
  t["model"]["continuing_subword_prefix"] = "##";
  ExpectRefused(t, "continuing_subword_prefix \"##\"");
  ExpectRefused(Tiny(), "\"legacy\": false",
                json{{"tokenizer_class", "LlamaTokenizerFast"}, {"legacy", false}});
  ExpectRefused(Tiny(), "bos_token \"<bos>\" is not in the vocabulary",
                json{{"bos_token", "<bos>"}});
}

TEST(HfTokenizerLoadTest, MetaspacePrependsToTheFirstSectionOnly) {
  auto t = Load(Tiny(), json{{"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}},
                             {"eos_token", nullptr}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Encode("hello world", false), (Ids{14, 16}));
  // After an added token, the section is not the first: no "▁" is prepended.
  EXPECT_EQ(*(*t)->Encode("<s>hello", false), (Ids{1, 13}));
  // "é" is not in the vocabulary: the bytes of that piece, after the prepended "▁" (id 2).
  EXPECT_EQ(*(*t)->Encode("\xC3\xA9", false), (Ids{2, 20 + 0xC3, 20 + 0xA9}));
  EXPECT_EQ(*(*t)->Decode(Ids{14, 16}, {}), "hello world");
  EXPECT_EQ(*(*t)->Decode(Ids{1, 14}, {}), "<s> hello");
  ASSERT_TRUE((*t)->bos().has_value());
  EXPECT_EQ((*t)->bos()->id, 1);
  EXPECT_FALSE((*t)->eos().has_value());
}

// Byte-fallback tokens are joined before they are decoded; a stream emits "é" only once its
// second byte arrives, and the leading space of the text is stripped once.
TEST(HfTokenizerLoadTest, StreamJoinsByteFallbackRuns) {
  auto t = Load(Tiny());
  ASSERT_TRUE(t.ok()) << t.status();
  Ids ids = {14, 20 + 0xC3, 20 + 0xA9, 16, 20 + 0xE4};
  auto stream = (*t)->NewStreamDecoder(false);
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(*stream->Push(id));
  chunks.push_back(*stream->Flush());
  EXPECT_EQ(chunks,
            (std::vector<std::string>{"hello", "", "\xC3\xA9", " world", "", "\xEF\xBF\xBD"}));
  EXPECT_EQ(*(*t)->Decode(ids, {}), "hello\xC3\xA9 world\xEF\xBF\xBD");
}

TEST(HfTokenizerLoadTest, AddedTokensStripTheirNeighboursWhiteSpace) {
  json j = Tiny();
  j["pre_tokenizer"] = nullptr;
  j["decoder"] = nullptr;
  j["model"]["vocab"]["<mask>"] = 300;
  j["added_tokens"].push_back(
      {{"id", 300}, {"content", "<mask>"}, {"special", false}, {"lstrip", true}, {"rstrip", true}});
  auto t = Load(j);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Encode("he  <mask>\t\nhe", false), (Ids{10, 300, 10}));
  // Without a decoder, tokens are joined by spaces; a stream does the same.
  EXPECT_EQ(*(*t)->Decode(Ids{10, 300, 10}, {}), "he <mask> he");
  auto stream = (*t)->NewStreamDecoder(false);
  std::string streamed;
  for (int32_t id : {10, 300, 10}) streamed += *stream->Push(id);
  EXPECT_EQ(streamed, "he <mask> he");
  EXPECT_FALSE((*t)->IsSpecial(300));
}

}  // namespace
}  // namespace connex::engine
