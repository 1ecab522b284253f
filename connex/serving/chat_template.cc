#include "connex/serving/chat_template.h"

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

}  // namespace connex::serving
