#include "connex/engine/tokenizer.h"

#include <filesystem>

#include "connex/base/strings.h"
#include "connex/engine/hf_tokenizer.h"
#include "connex/engine/internal/utf8.h"

namespace connex::engine {
namespace {

constexpr std::string_view kByteBosText = "<s>";
constexpr std::string_view kByteEosText = "</s>";

// The bytes of a trailing run of U+FFFD in `text`.
size_t TrailingReplacementBytes(std::string_view text) {
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t n = 0;
  while (text.size() >= n + kReplacement.size() &&
         text.substr(text.size() - n - kReplacement.size(), kReplacement.size()) == kReplacement) {
    n += kReplacement.size();
  }
  return n;
}

class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer()
      : bos_(SpecialToken{std::string(kByteBosText), kBosToken}),
        eos_(SpecialToken{std::string(kByteEosText), kEosToken}) {}

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const override {
    return Tokenize(text, add_special_tokens);
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     const DecodeOptions& options) const override {
    return DecodeFragment(ids, options.skip_special_tokens, /*continuation=*/false);
  }
  absl::StatusOr<std::string> DecodeFragment(std::span<const int32_t> ids, bool skip_special,
                                             bool) const override {
    std::string bytes;
    std::string text;
    for (int32_t id : ids) {
      if (id < 0 || id >= kByteVocab) return TokenIdOutOfRange(id, kByteVocab);
      if (id < 256) {
        bytes.push_back(static_cast<char>(id));
        continue;
      }
      if (skip_special) continue;
      text += internal::DecodeUtf8Lossy(bytes);
      bytes.clear();
      text += id == kBosToken ? kByteBosText : kByteEosText;
    }
    return text + internal::DecodeUtf8Lossy(bytes);
  }
  bool CanCutAfter(int32_t) const override { return true; }
  int32_t vocab_size() const override { return kByteVocab; }
  std::optional<int32_t> TokenId(std::string_view token) const override {
    if (token == kByteBosText) return kBosToken;
    if (token == kByteEosText) return kEosToken;
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }
  absl::StatusOr<std::string> TokenText(int32_t id) const override {
    if (id < 0 || id >= kByteVocab) return TokenIdOutOfRange(id, kByteVocab);
    if (id == kBosToken) return std::string(kByteBosText);
    if (id == kEosToken) return std::string(kByteEosText);
    return std::string(1, static_cast<char>(id));
  }
  bool IsSpecial(int32_t id) const override { return id == kBosToken || id == kEosToken; }
  const std::optional<SpecialToken>& bos() const override { return bos_; }
  const std::optional<SpecialToken>& eos() const override { return eos_; }

 private:
  std::optional<SpecialToken> bos_;
  std::optional<SpecialToken> eos_;
};

}  // namespace

absl::Status TokenIdOutOfRange(int32_t id, int32_t vocab_size) {
  return absl::InvalidArgumentError(
      StrCat("tokenizer: token id ", id, " is out of range [0, ", vocab_size, ")"));
}

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

std::unique_ptr<StreamDecoder> Tokenizer::NewStreamDecoder(bool skip_special_tokens) const {
  return std::make_unique<StreamDecoder>(*this, skip_special_tokens);
}

absl::StatusOr<std::string> StreamDecoder::Push(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size())
    return TokenIdOutOfRange(id, tokenizer_.vocab_size());
  window_.push_back(id);
  absl::StatusOr<std::string> text =
      tokenizer_.DecodeFragment(window_, skip_special_tokens_, started_);
  if (!text.ok()) {
    window_.pop_back();
    return text.status();
  }
  // The window's text only grows at its end, except for a trailing U+FFFD (an incomplete
  // character that later bytes may complete), which is held back.
  size_t ready = text->size() - TrailingReplacementBytes(*text);
  std::string out;
  if (ready > emitted_) {
    out = text->substr(emitted_, ready - emitted_);
    emitted_ = ready;
  }
  // Cut when the window's text is final: nothing held back, no run open, and the start of the
  // text (where a leading space may be stripped) is behind us.
  if (ready == text->size() && tokenizer_.CanCutAfter(id) && (started_ || !text->empty())) {
    window_.clear();
    emitted_ = 0;
    started_ = true;
  }
  return out;
}

absl::StatusOr<std::string> StreamDecoder::Flush() {
  absl::StatusOr<std::string> text =
      tokenizer_.DecodeFragment(window_, skip_special_tokens_, started_);
  if (!text.ok()) return text.status();
  std::string out = emitted_ < text->size() ? text->substr(emitted_) : std::string();
  started_ = started_ || !text->empty();
  window_.clear();
  emitted_ = 0;
  return out;
}

TokenizerPtr NewByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

absl::StatusOr<TokenizerPtr> LoadTokenizer(const std::string& model_dir) {
  absl::StatusOr<std::unique_ptr<HfTokenizer>> hf = HfTokenizer::Load(model_dir);
  if (!hf.ok()) return hf.status();
  return TokenizerPtr(std::move(*hf));
}

}  // namespace connex::engine
