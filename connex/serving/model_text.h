// ModelText: the text side of a served model — its tokenizer, its chat template and the tokens
// that end a generation — as stage 0 (OpenAiServer) and connex-generate both use it, so that the
// two turn prompts into ids and generated ids into text the same way. A model directory with a
// tokenizer.json is served with that tokenizer and the chat template of its
// tokenizer_config.json (--chat-template FILE overrides it); connex-mkmodel's test models (no
// tokenizer.json) keep the byte tokenizer and the built-in template (chat_template.h).
// Thread-safe: immutable once loaded.
#ifndef CONNEX_SERVING_MODEL_TEXT_H_
#define CONNEX_SERVING_MODEL_TEXT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/engine/tokenizer.h"
#include "connex/serving/chat_template.h"
#include "connex/serving/openai_api.h"

namespace connex::serving {

class ModelText {
 public:
  // The text side of the checkpoint at `model_path` (a directory, or a .safetensors file whose
  // directory is read). `config_eos` are the checkpoint's EOS ids (config eos_token_id, an int or
  // a list); `chat_template_path` (--chat-template) is "" or a template file overriding the
  // model's. Errors name the file: a tokenizer.json or template that does not load, a
  // --chat-template file that is missing.
  static absl::StatusOr<std::unique_ptr<const ModelText>> Load(
      const std::string& model_path, std::span<const int64_t> config_eos,
      const std::string& chat_template_path = "");

  const engine::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Whether the tokenizer is the byte tokenizer (no tokenizer.json).
  bool byte_level() const { return byte_level_; }
  // Where the chat template comes from ("built-in", a tokenizer_config.json, a --chat-template
  // file), or "" when the model has none (chat requests are refused).
  const std::string& chat_template_source() const { return template_source_; }

  // The ids of a completion prompt: tokenized with add_special_tokens (BOS for the byte tokenizer,
  // Llama 2 and 3.1; the post-processor decides). InvalidArgument: the text is not UTF-8.
  absl::StatusOr<std::vector<int32_t>> CompletionPrompt(std::string_view text,
                                                        bool add_special_tokens = true) const;
  // The ids of a conversation's prompt: the chat template's rendering, tokenized without adding
  // special tokens (the template writes BOS itself); the built-in template's with BOS first, as
  // before. FailedPrecondition (naming --chat-template) when the model has no template;
  // InvalidArgument when the template refuses the conversation (raise_exception, ...).
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(std::span<const ChatMessage> messages,
                                                  bool add_generation_prompt = true) const;
  // The rendered text itself (the built-in template's too).
  absl::StatusOr<std::string> RenderChat(std::span<const ChatMessage> messages,
                                         bool add_generation_prompt = true) const;

  // Every token that ends a generation, sorted: the checkpoint's EOS ids, the tokenizer's
  // eos_token, and the chat template's end-of-turn tokens (<|eot_id|>, <|im_end|>). They end
  // completions as well as chats: a chat that connex-proxy resumes elsewhere continues as a
  // completion of its token ids, and must stop where the chat would (instruct models list them
  // in generation_config.json's eos_token_id anyway).
  const std::vector<int32_t>& stop_tokens() const { return stop_tokens_; }
  bool Stops(int32_t token) const;

  // A decoder of the text generated after `prompt`: the prompt's ids are pushed first (their
  // text dropped), so the first generated token decodes as the continuation it is — a leading
  // space kept — and a request resumed with prompt + the tokens already streamed (connex-proxy)
  // has its decoder in the state the undisturbed request's was in at that token, so it goes on
  // with the same text. Generated ids are decoded with skip_special_tokens (BOS, EOS
  // and end-of-turn have no text).
  std::unique_ptr<engine::StreamDecoder> NewDecoder(std::span<const int32_t> prompt) const;

  // The whole text of `generated` after `prompt`, as stage 0 streams it: the decoder above,
  // stopped before the first stop token (unless `ignore_eos`: a request that asked for it runs
  // on past them, and they have no text). What connex-generate prints, so the two agree.
  std::string GeneratedText(std::span<const int32_t> prompt, std::span<const int32_t> generated,
                            bool ignore_eos = false) const;

 private:
  ModelText() = default;
  engine::TokenizerPtr tokenizer_;
  bool byte_level_ = true;
  std::optional<ChatTemplate> template_;  // none: the built-in one (byte) or no template
  std::string template_source_;
  std::vector<int32_t> stop_tokens_;
};

}  // namespace connex::serving

#endif  // CONNEX_SERVING_MODEL_TEXT_H_
