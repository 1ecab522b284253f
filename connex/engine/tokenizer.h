// Tokenizers: text to token ids and back. `Tokenizer` is the interface; the byte tokenizer (token
// i < 256 is byte i, then BOS 256 and EOS 257 — lossless for any bytes, used by connex-mkmodel's
// test models) and the Hugging Face tokenizer of a model directory (tokenizer.json +
// tokenizer_config.json, hf_tokenizer.h) implement it. `StreamDecoder` turns generated ids into
// text one id at a time without ever emitting half a character.
// Thread contract: a Tokenizer is thread-safe (all methods const, callable from any thread); a
// StreamDecoder is thread-compatible (one per generated sequence).
#ifndef CONNEX_ENGINE_TOKENIZER_H_
#define CONNEX_ENGINE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::engine {

inline constexpr int32_t kBosToken = 256;
inline constexpr int32_t kEosToken = 257;
inline constexpr int32_t kByteVocab = 258;

// One token per byte of `text`, with BOS first when `add_bos` (the byte tokenizer's Encode).
std::vector<int32_t> Tokenize(std::string_view text, bool add_bos);

// The bytes of the byte tokens in `tokens`; special and out-of-range tokens produce nothing.
// Lossless: the result may be invalid UTF-8 (ByteTokenizer's Decode is the valid-UTF-8 form).
std::string Detokenize(std::span<const int32_t> tokens);

struct DecodeOptions {
  // Leave out special tokens (BOS, EOS, `<|eot_id|>`, ...; Hugging Face's skip_special_tokens).
  bool skip_special_tokens = false;
  // Hugging Face's clean-up of English tokenization spaces (" ." -> ".", " n't" -> "n't", ...).
  // nullopt: as tokenizer_config.json's clean_up_tokenization_spaces says (default true).
  std::optional<bool> clean_up_tokenization_spaces;
};

// A token with a role (BOS, EOS): its text and its id.
struct SpecialToken {
  std::string text;
  int32_t id;
};

class StreamDecoder;

// The error for a token id outside [0, vocab_size): InvalidArgument naming both.
absl::Status TokenIdOutOfRange(int32_t id, int32_t vocab_size);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text` (UTF-8). Added and special tokens written in the text (`<|eot_id|>`) are
  // matched first, as Hugging Face does; with `add_special_tokens`, the post-processor's tokens
  // (BOS for Llama 2 and 3.1) are added. InvalidArgument: `text` is not valid UTF-8, or a piece
  // has no token and the model has no unknown token.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool add_special_tokens) const = 0;

  // The text of `ids`, always valid UTF-8 (bytes that do not form UTF-8 become U+FFFD).
  // InvalidArgument naming the id: an id outside [0, vocab_size()).
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                             const DecodeOptions& options) const = 0;

  // One more than the largest token id. Ids below it that no token has decode to nothing.
  virtual int32_t vocab_size() const = 0;
  // The id of the token whose text is `token` (e.g. "<|eot_id|>", "<|im_end|>").
  virtual std::optional<int32_t> TokenId(std::string_view token) const = 0;
  // The text of token `id` as the vocabulary writes it (byte-level tokens in their alphabet).
  // InvalidArgument: out of range; NotFound: no token has this id.
  virtual absl::StatusOr<std::string> TokenText(int32_t id) const = 0;
  // Whether `id` is a special token (skipped by skip_special_tokens).
  virtual bool IsSpecial(int32_t id) const = 0;
  // BOS and EOS as tokenizer_config.json names them (absent when it has none or null).
  virtual const std::optional<SpecialToken>& bos() const = 0;
  virtual const std::optional<SpecialToken>& eos() const = 0;

  // A decoder for one generated sequence; it borrows this tokenizer, which must outlive it.
  std::unique_ptr<StreamDecoder> NewStreamDecoder(bool skip_special_tokens) const;

  // The building blocks of StreamDecoder. DecodeFragment is Decode without the clean-up; with
  // `continuation`, `ids` follow tokens whose text was produced already, so effects on the start
  // of the text (a stripped leading space) are not applied. CanCutAfter: whether the text of the
  // ids up to `id` is final, whatever follows (false inside a run of byte-fallback tokens).
  virtual absl::StatusOr<std::string> DecodeFragment(std::span<const int32_t> ids,
                                                     bool skip_special_tokens,
                                                     bool continuation) const = 0;
  virtual bool CanCutAfter(int32_t id) const = 0;
};
using TokenizerPtr = std::unique_ptr<Tokenizer>;

// Decodes generated ids one at a time. Each Push returns the text that became final: never half
// a UTF-8 character (a character split across tokens, or across byte-fallback `<0xE4>` tokens,
// comes out whole once its last byte arrives; a trailing U+FFFD is held back until a later token
// shows it is not the start of a character). The pushed chunks plus Flush() equal
// Decode(ids, {skip_special_tokens, clean_up_tokenization_spaces = false}).
// Thread-compatible.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // The text that `id` completes (often empty). InvalidArgument for an id outside
  // [0, vocab_size()), and the decoder is unchanged.
  absl::StatusOr<std::string> Push(int32_t id);
  // The text held back (an incomplete character becomes U+FFFD), at the end of the sequence or
  // of a turn; later pushes continue the same text.
  absl::StatusOr<std::string> Flush();

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::vector<int32_t> window_;  // ids since the last cut
  size_t emitted_ = 0;           // bytes of the window's text already returned
  bool started_ = false;         // text was produced before the window
};

// The byte tokenizer: Encode is Tokenize (add_special_tokens adds BOS; "<s>" in the text is
// bytes, so any byte string round-trips), Decode writes BOS and EOS as "<s>" and "</s>" unless
// skipped.
TokenizerPtr NewByteTokenizer();

// The Hugging Face tokenizer of `model_dir` (tokenizer.json, tokenizer_config.json).
// NotFound: no tokenizer.json; InvalidArgument naming the file and field: malformed JSON or a
// component this implementation refuses (e.g. `pre_tokenizer type "Whitespace" is not supported`).
absl::StatusOr<TokenizerPtr> LoadTokenizer(const std::string& model_dir);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_TOKENIZER_H_
