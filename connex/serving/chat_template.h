// The chat template of the reference model (connex/engine): turns a conversation into the prompt
// text that /v1/chat/completions generates from. docs/serving.md shows it. Thread-safe (pure).
//
// The reference tokenizer is byte-level (every byte is a token, plus BOS 256 and EOS 257), so any
// text tokenizes exactly and the template needs no special tokens of its own: the stage runner
// tokenizes the rendered text with BOS first (`Tokenize(text, /*add_bos=*/true)`), and a generated
// EOS ends the assistant's turn. Each message becomes
//   "<|" role "|>\n" content "\n"
// and the prompt ends with "<|assistant|>\n", the turn the model writes. The markers are plain
// text: content that contains them is not escaped (the reference model has no special tokens to
// escape them into).
#ifndef CONNEX_SERVING_CHAT_TEMPLATE_H_
#define CONNEX_SERVING_CHAT_TEMPLATE_H_

#include <span>
#include <string>

#include "connex/serving/openai_api.h"

namespace connex::serving {

std::string RenderChatPrompt(std::span<const ChatMessage> messages);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_CHAT_TEMPLATE_H_
