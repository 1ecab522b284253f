#include "connex/engine/tokenizer.h"

namespace connex::engine {

std::vector<int32_t> Tokenize(std::string_view text, bool add_bos) {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() + 1);
  if (add_bos) tokens.push_back(kBosToken);
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

std::string Detokenize(std::span<const int32_t> tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256) text.push_back(static_cast<char>(t));
  }
  return text;
}

}  // namespace connex::engine
