// Chat templates: turning a conversation into the prompt text a model generates from.
// Thread-safe: RenderChatPrompt is pure; a ChatTemplate is immutable once loaded and may be
// rendered from several threads at once.
//
// Two kinds:
//  - RenderChatPrompt, the built-in template of the reference model (connex/engine) and of
//    connex-mkmodel's byte-tokenizer test models. Their tokenizer is byte-level (every byte is a
//    token, plus BOS 256 and EOS 257), so any text tokenizes exactly and the template needs no
//    special tokens: the stage runner tokenizes the rendered text with BOS first, and a generated
//    EOS ends the assistant's turn. Each message becomes "<|" role "|>\n" content "\n" and the
//    prompt ends with "<|assistant|>\n". The markers are plain text: content that contains them is
//    not escaped.
//  - ChatTemplate, a real model's own Jinja `chat_template` (from its tokenizer_config.json, or a
//    file given with --chat-template), rendered exactly as transformers.js renders it
//    (docs/design/chat-template.md lists the Jinja subset and how the end-of-turn strings are
//    derived).
#ifndef CONNEX_SERVING_CHAT_TEMPLATE_H_
#define CONNEX_SERVING_CHAT_TEMPLATE_H_

#include <ctime>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/serving/openai_api.h"
#include "nlohmann/json.hpp"

namespace connex::serving {

namespace jinja {
class Template;
}

std::string RenderChatPrompt(std::span<const ChatMessage> messages);

// What a template may print besides the conversation, from tokenizer_config.json.
struct TokenizerSpecials {
  // bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token: those the config
  // sets (a string, or an AddedToken object's content). Every render sees them as variables.
  std::vector<std::pair<std::string, std::string>> named;
  // The contents of the added tokens marked special (added_tokens_decoder), e.g. "<|eot_id|>".
  std::vector<std::string> special_tokens;
  // The value of a named token ("eos_token"); empty if the config does not set it.
  std::string Named(std::string_view name) const;
};

// The special tokens of a parsed tokenizer_config.json. InvalidArgument naming the field when a
// token is neither a string, null nor an object with a "content" string.
absl::StatusOr<TokenizerSpecials> SpecialsFromTokenizerConfig(const nlohmann::ordered_json& config);

struct ChatRenderOptions {
  // Whether the prompt ends by opening the assistant's turn (what /v1/chat/completions needs).
  bool add_generation_prompt = true;
  // The request's `tools` (a JSON list of function schemas) and RAG `documents`; null when absent,
  // as transformers passes them.
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json documents = nullptr;
  // Further template variables (chat_template_kwargs: enable_thinking, date_string, …). They
  // override the special tokens of the same name, as in transformers.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  // The local time strftime_now() prints (Llama 3.2's "Today Date"); now when empty.
  std::function<std::tm()> local_time;
};

class ChatTemplate {
 public:
  // The `chat_template` of a tokenizer_config.json (a path, or its parsed JSON). It may be one
  // template or a list of named ones ({"name", "template"}): then "default" renders, and
  // "tool_use" instead when a render passes tools and the list has it (transformers' rule).
  // NotFound: the file is missing or the config has no chat_template (Llama 2's has none; serve it
  // with --chat-template FILE). InvalidArgument: the JSON or a template does not parse (the
  // message names the template line, column and construct).
  static absl::StatusOr<ChatTemplate> FromTokenizerConfigFile(const std::string& path);
  static absl::StatusOr<ChatTemplate> FromTokenizerConfig(const nlohmann::ordered_json& config);

  // A template given as text, or in a file (--chat-template FILE: a .jinja/plain-text template, or
  // a .json file with a "chat_template" field such as chat_template.json), with the model's
  // special tokens (from its tokenizer_config.json, or none).
  static absl::StatusOr<ChatTemplate> FromSource(std::string_view source,
                                                 TokenizerSpecials specials = {});
  static absl::StatusOr<ChatTemplate> FromTemplateFile(const std::string& path,
                                                       TokenizerSpecials specials = {});

  // The prompt for `messages`, a JSON list of OpenAI-style messages ({"role", "content"} and
  // whatever else a template reads: tool_calls, name, reasoning_content, …). InvalidArgument naming
  // the template position and construct on a render error; when the template calls
  // raise_exception(m) (e.g. Llama 3.2 with tools and no user message), the message ends in
  // "raise_exception: m".
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     const ChatRenderOptions& options = {}) const;
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                     const ChatRenderOptions& options = {}) const;

  // Strings whose generation ends the assistant's turn, for serving to stop on: the eos_token and
  // the special token the template writes right after an assistant message's content (e.g.
  // "<|eot_id|>" for Llama 3, "<|im_end|>" for Qwen); see docs/design/chat-template.md.
  const std::vector<std::string>& end_of_turn() const { return end_of_turn_; }
  const TokenizerSpecials& specials() const { return specials_; }

 private:
  struct Named {
    std::string name;  // "default" for a single template
    std::shared_ptr<const jinja::Template> parsed;
  };
  ChatTemplate(std::vector<Named> templates, TokenizerSpecials specials);
  static absl::StatusOr<ChatTemplate> Make(std::vector<std::pair<std::string, std::string>> sources,
                                           TokenizerSpecials specials);
  const jinja::Template* Pick(bool with_tools) const;
  std::vector<std::string> DeriveEndOfTurn() const;

  std::vector<Named> templates_;
  TokenizerSpecials specials_;
  std::vector<std::string> end_of_turn_;
};

}  // namespace connex::serving

#endif  // CONNEX_SERVING_CHAT_TEMPLATE_H_
