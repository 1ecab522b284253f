#include "connex/serving/chat_template.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/serving/jinja/template.h"

namespace connex::serving {

std::string RenderChatPrompt(std::span<const ChatMessage> messages) {
  std::string prompt;
  for (const ChatMessage& message : messages) {
    prompt += "<|";
    prompt += message.role;
    prompt += "|>\n";
    prompt += message.content;
    prompt += "\n";
  }
  prompt += "<|assistant|>\n";
  return prompt;
}

namespace {

// The names transformers passes to every render (SPECIAL_TOKEN_ATTRIBUTES), in its order.
constexpr const char* kNamedTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot be opened"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<nlohmann::ordered_json> ParseJsonFile(const std::string& text,
                                                     const std::string& origin) {
  nlohmann::ordered_json json = ParseOrderedJson(text);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid JSON"));
  }
  return json;
}

}  // namespace

std::string TokenizerSpecials::Named(std::string_view name) const {
  for (const auto& [key, value] : named) {
    if (key == name) return value;
  }
  return std::string();
}

absl::StatusOr<TokenizerSpecials> SpecialsFromTokenizerConfig(
    const nlohmann::ordered_json& config) {
  TokenizerSpecials specials;
  if (!config.is_object()) return absl::InvalidArgumentError("tokenizer_config: not a JSON object");
  for (const char* name : kNamedTokens) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    std::string value;
    if (it->is_string()) {
      value = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      value = (*it)["content"].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer_config: ", name, " must be a string or an object with a \"content\" string"));
    }
    if (!value.empty()) specials.named.emplace_back(name, std::move(value));
  }
  if (auto it = config.find("added_tokens_decoder"); it != config.end() && it->is_object()) {
    for (const auto& [id, token] : it->items()) {
      if (token.is_object() && token.value("special", false) && token.contains("content") &&
          token["content"].is_string()) {
        specials.special_tokens.push_back(token["content"].get<std::string>());
      }
    }
  }
  return specials;
}

ChatTemplate::ChatTemplate(std::vector<Named> templates, TokenizerSpecials specials)
    : templates_(std::move(templates)), specials_(std::move(specials)) {
  end_of_turn_ = DeriveEndOfTurn();
}

absl::StatusOr<ChatTemplate> ChatTemplate::Make(
    std::vector<std::pair<std::string, std::string>> sources, TokenizerSpecials specials) {
  std::vector<Named> templates;
  for (auto& [name, source] : sources) {
    auto parsed = jinja::Template::Parse(source);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template \"", name, "\": ", parsed.status().message()));
    }
    templates.push_back(Named{name, std::make_shared<const jinja::Template>(*std::move(parsed))});
  }
  const bool has_default = std::any_of(templates.begin(), templates.end(),
                                       [](const Named& t) { return t.name == "default"; });
  if (!has_default) {
    std::vector<std::string> names;
    for (const Named& t : templates) names.push_back(t.name);
    return absl::InvalidArgumentError(
        absl::StrCat("chat_template: a list of templates needs one named \"default\"; it has ",
                     absl::StrJoin(names, ", ")));
  }
  return ChatTemplate(std::move(templates), std::move(specials));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfigFile(const std::string& path) {
  CONNEX_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "tokenizer_config"));
  CONNEX_ASSIGN_OR_RETURN(nlohmann::ordered_json config, ParseJsonFile(text, path));
  auto result = FromTokenizerConfig(config);
  if (!result.ok()) return Annotate(result.status(), path);
  return result;
}

namespace {

// The named sources of a `chat_template` field: one template ("default"), or a list of
// {"name", "template"}.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TemplateSources(
    const nlohmann::ordered_json& field) {
  std::vector<std::pair<std::string, std::string>> sources;
  if (field.is_string()) {
    sources.emplace_back("default", field.get<std::string>());
    return sources;
  }
  if (!field.is_array()) {
    return absl::InvalidArgumentError(
        "chat_template must be a string or a list of named templates");
  }
  for (const auto& entry : field) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return absl::InvalidArgumentError(
          "chat_template: each entry of a list must be {\"name\": string, \"template\": "
          "string}");
    }
    sources.emplace_back(entry["name"].get<std::string>(), entry["template"].get<std::string>());
  }
  return sources;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(
    const nlohmann::ordered_json& config) {
  CONNEX_ASSIGN_OR_RETURN(TokenizerSpecials specials, SpecialsFromTokenizerConfig(config));
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(
        "tokenizer_config has no chat_template (give the model's template with --chat-template "
        "FILE)");
  }
  CONNEX_ASSIGN_OR_RETURN(auto sources, TemplateSources(*it));
  return Make(std::move(sources), std::move(specials));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(std::string_view source,
                                                      TokenizerSpecials specials) {
  return Make({{"default", std::string(source)}}, std::move(specials));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTemplateFile(const std::string& path,
                                                            TokenizerSpecials specials) {
  CONNEX_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "chat template"));
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    CONNEX_ASSIGN_OR_RETURN(nlohmann::ordered_json json, ParseJsonFile(text, path));
    if (!json.is_object() || !json.contains("chat_template")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no \"chat_template\" field"));
    }
    auto sources = TemplateSources(json["chat_template"]);
    if (!sources.ok()) return Annotate(sources.status(), path);
    auto result = Make(*std::move(sources), std::move(specials));
    if (!result.ok()) return Annotate(result.status(), path);
    return result;
  }
  auto result = FromSource(text, std::move(specials));
  if (!result.ok()) return Annotate(result.status(), path);
  return result;
}

const jinja::Template* ChatTemplate::Pick(bool with_tools) const {
  const jinja::Template* fallback = nullptr;
  for (const Named& t : templates_) {
    if (with_tools && t.name == "tool_use") return t.parsed.get();
    if (t.name == "default") fallback = t.parsed.get();
  }
  return fallback;
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                 const ChatRenderOptions& options) const {
  if (!messages.is_array())
    return absl::InvalidArgumentError("chat template: messages must be a list");
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  variables["messages"] = messages;
  variables["add_generation_prompt"] = options.add_generation_prompt;
  variables["tools"] = options.tools;
  variables["documents"] = options.documents;
  for (const auto& [name, value] : specials_.named) variables[name] = value;
  if (!options.extra.is_null()) {
    if (!options.extra.is_object()) {
      return absl::InvalidArgumentError("chat template: extra variables must be a JSON object");
    }
    for (const auto& [name, value] : options.extra.items()) variables[name] = value;
  }
  auto rendered = Pick(!options.tools.is_null())
                      ->Render(variables, jinja::RenderOptions{.local_time = options.local_time});
  if (!rendered.ok()) return Annotate(rendered.status(), "chat template");
  return rendered;
}

absl::StatusOr<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                 const ChatRenderOptions& options) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& message : messages) {
    list.push_back({{"role", message.role}, {"content", message.content}});
  }
  return Render(list, options);
}

std::vector<std::string> ChatTemplate::DeriveEndOfTurn() const {
  std::vector<std::string> out;
  const auto add = [&out](std::string s) {
    if (!s.empty() && std::find(out.begin(), out.end(), s) == out.end())
      out.push_back(std::move(s));
  };
  // What the template writes right after an assistant message's content ends that turn.
  static constexpr std::string_view kSentinel =
      "\x1f"
      "connex-end-of-turn-probe"
      "\x1f";
  nlohmann::ordered_json probe = nlohmann::ordered_json::array();
  probe.push_back({{"role", "user"}, {"content", "hi"}});
  probe.push_back({{"role", "assistant"}, {"content", std::string(kSentinel)}});
  ChatRenderOptions options;
  options.add_generation_prompt = false;
  options.local_time = [] { return std::tm{}; };
  auto rendered = Render(probe, options);
  if (rendered.ok()) {
    const size_t at = rendered->rfind(kSentinel);
    if (at != std::string::npos) {
      std::string_view after = std::string_view(*rendered).substr(at + kSentinel.size());
      while (!after.empty() && (after[0] == ' ' || after[0] == '\n')) after.remove_prefix(1);
      std::string best;
      for (const std::string& token : specials_.special_tokens) {
        if (after.substr(0, token.size()) == token && token.size() > best.size()) best = token;
      }
      if (best.empty() && specials_.special_tokens.empty() && !after.empty() && after[0] == '<') {
        const size_t close = after.find('>');
        if (close != std::string_view::npos) best = std::string(after.substr(0, close + 1));
      }
      add(best);
    }
  }
  add(specials_.Named("eos_token"));
  return out;
}

}  // namespace connex::serving
