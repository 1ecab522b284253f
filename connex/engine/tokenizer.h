// The byte-level tokenizer: token i < 256 is byte i, then BOS (256) and EOS (257). Lossless for
// any byte string (UTF-8 or not), so prompt + generated text re-tokenizes exactly.
// Thread-safe (pure functions).
#ifndef CONNEX_ENGINE_TOKENIZER_H_
#define CONNEX_ENGINE_TOKENIZER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace connex::engine {

inline constexpr int32_t kBosToken = 256;
inline constexpr int32_t kEosToken = 257;
inline constexpr int32_t kByteVocab = 258;

// One token per byte of `text`, with BOS first when `add_bos`.
std::vector<int32_t> Tokenize(std::string_view text, bool add_bos);

// The bytes of the byte tokens in `tokens`; special and out-of-range tokens produce nothing.
std::string Detokenize(std::span<const int32_t> tokens);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_TOKENIZER_H_
