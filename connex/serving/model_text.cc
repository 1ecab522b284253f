#include "connex/serving/model_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "connex/base/json_text.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

namespace fs = std::filesystem;

// The directory of a checkpoint path: itself, or a .safetensors file's folder.
std::string ModelDir(const std::string& model_path) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return model_path;
  fs::path parent = fs::path(model_path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// The special tokens of `dir`/tokenizer_config.json, for a --chat-template file (none when the
// directory has no config).
absl::StatusOr<TokenizerSpecials> SpecialsOf(const std::string& dir) {
  const std::string path = dir + "/tokenizer_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return TokenizerSpecials{};
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::ordered_json config = ParseOrderedJson(text.str());
  if (config.is_discarded()) return absl::InvalidArgumentError(StrCat(path, ": not valid JSON"));
  absl::StatusOr<TokenizerSpecials> specials = SpecialsFromTokenizerConfig(config);
  if (!specials.ok()) return Annotate(specials.status(), path);
  return specials;
}

}  // namespace

absl::StatusOr<std::unique_ptr<const ModelText>> ModelText::Load(
    const std::string& model_path, std::span<const int64_t> config_eos,
    const std::string& chat_template_path) {
  std::unique_ptr<ModelText> t(new ModelText());
  const std::string dir = ModelDir(model_path);
  std::error_code ec;
  t->byte_level_ = !fs::exists(dir + "/tokenizer.json", ec);
  if (t->byte_level_) {
    t->tokenizer_ = engine::NewByteTokenizer();
  } else {
    absl::StatusOr<engine::TokenizerPtr> loaded = engine::LoadTokenizer(dir);
    if (!loaded.ok()) return loaded.status();
    t->tokenizer_ = *std::move(loaded);
  }

  if (!chat_template_path.empty()) {
    CONNEX_ASSIGN_OR_RETURN(TokenizerSpecials specials, SpecialsOf(dir));
    absl::StatusOr<ChatTemplate> loaded =
        ChatTemplate::FromTemplateFile(chat_template_path, std::move(specials));
    if (!loaded.ok()) return Annotate(loaded.status(), "--chat-template");
    t->template_.emplace(*std::move(loaded));
    t->template_source_ = chat_template_path;
  } else if (t->byte_level_) {
    t->template_source_ = "built-in";
  } else {
    const std::string config = dir + "/tokenizer_config.json";
    absl::StatusOr<ChatTemplate> loaded = ChatTemplate::FromTokenizerConfigFile(config);
    if (loaded.ok()) {
      t->template_.emplace(*std::move(loaded));
      t->template_source_ = config;
    } else if (loaded.status().code() != absl::StatusCode::kNotFound) {
      return loaded.status();
    }
    // NotFound (no config, or no chat_template in it, as Llama 2's): completions only.
  }

  const int32_t vocab = t->tokenizer_->vocab_size();
  auto add = [&](int64_t id) {
    if (id >= 0 && id < vocab) t->stop_tokens_.push_back(static_cast<int32_t>(id));
  };
  for (int64_t id : config_eos) add(id);
  if (const auto& eos = t->tokenizer_->eos(); eos) add(eos->id);
  if (t->template_) {
    for (const std::string& end : t->template_->end_of_turn()) {
      if (std::optional<int32_t> id = t->tokenizer_->TokenId(end)) add(*id);
    }
  }
  std::sort(t->stop_tokens_.begin(), t->stop_tokens_.end());
  t->stop_tokens_.erase(std::unique(t->stop_tokens_.begin(), t->stop_tokens_.end()),
                        t->stop_tokens_.end());
  return std::unique_ptr<const ModelText>(std::move(t));
}

absl::StatusOr<std::vector<int32_t>> ModelText::CompletionPrompt(std::string_view text,
                                                                 bool add_special_tokens) const {
  return tokenizer_->Encode(text, add_special_tokens);
}

absl::StatusOr<std::string> ModelText::RenderChat(std::span<const ChatMessage> messages,
                                                  bool add_generation_prompt) const {
  if (template_) {
    ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    return template_->Render(messages, options);
  }
  if (byte_level_) return RenderChatPrompt(messages);
  return absl::FailedPreconditionError(
      "this model has no chat template (its tokenizer_config.json has no chat_template): start "
      "connex-stage with --chat-template FILE, or send /v1/completions");
}

absl::StatusOr<std::vector<int32_t>> ModelText::ChatPrompt(std::span<const ChatMessage> messages,
                                                           bool add_generation_prompt) const {
  CONNEX_ASSIGN_OR_RETURN(std::string text, RenderChat(messages, add_generation_prompt));
  // The built-in template has no BOS of its own; a model's template writes it.
  return tokenizer_->Encode(text, /*add_special_tokens=*/!template_ && byte_level_);
}

bool ModelText::Stops(int32_t token) const {
  return std::binary_search(stop_tokens_.begin(), stop_tokens_.end(), token);
}

std::unique_ptr<engine::StreamDecoder> ModelText::NewDecoder(
    std::span<const int32_t> prompt) const {
  std::unique_ptr<engine::StreamDecoder> decoder =
      tokenizer_->NewStreamDecoder(/*skip_special_tokens=*/true);
  // Ids outside the tokenizer's vocabulary push nothing (a failed push leaves it unchanged). No
  // Flush: a prompt that ends inside a character — a resume whose streamed tokens ended there —
  // has the generated tokens complete it, as the undisturbed request did.
  for (int32_t id : prompt) (void)decoder->Push(id);
  return decoder;
}

std::string ModelText::GeneratedText(std::span<const int32_t> prompt,
                                     std::span<const int32_t> generated, bool ignore_eos) const {
  std::unique_ptr<engine::StreamDecoder> decoder = NewDecoder(prompt);
  std::string text;
  for (int32_t id : generated) {
    if (!ignore_eos && Stops(id)) break;
    if (absl::StatusOr<std::string> piece = decoder->Push(id); piece.ok()) text += *piece;
  }
  if (absl::StatusOr<std::string> rest = decoder->Flush(); rest.ok()) text += *rest;
  return text;
}

}  // namespace connex::serving
