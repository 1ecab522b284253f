// The Hugging Face tokenizer of a model directory: tokenizer.json (a BPE model with its
// normalizer, pre-tokenizer, post-processor and decoder, and the added tokens) and
// tokenizer_config.json (BOS / EOS, extra special tokens, clean-up of decoded spaces). It behaves
// as transformers.js does (the tests compare every id and decoded text with it) for the
// byte-level families (Llama 3, 3.1, 3.2, Qwen 2.5, 3) and the SentencePiece-style ones with byte
// fallback (Llama 2, Mistral, TinyLlama). Anything else in the files is refused by name.
// Thread-safe (see Tokenizer).
#ifndef CONNEX_ENGINE_HF_TOKENIZER_H_
#define CONNEX_ENGINE_HF_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "connex/engine/tokenizer.h"

namespace connex::engine {
namespace internal {
class BpeModel;
class Decoder;
class Normalizer;
class PostProcessor;
class PreTokenizer;
}  // namespace internal

class HfTokenizer final : public Tokenizer {
 public:
  // Reads `model_dir`/tokenizer.json and `model_dir`/tokenizer_config.json (optional).
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& model_dir);
  // From the two files' contents (`config_json` may be empty); `name` prefixes errors.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json,
                                                               const std::string& name);
  ~HfTokenizer() override;

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const override;
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     const DecodeOptions& options) const override;
  absl::StatusOr<std::string> DecodeFragment(std::span<const int32_t> ids, bool skip_special_tokens,
                                             bool continuation) const override;
  bool CanCutAfter(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_text_.size()); }
  std::optional<int32_t> TokenId(std::string_view token) const override;
  absl::StatusOr<std::string> TokenText(int32_t id) const override;
  bool IsSpecial(int32_t id) const override;
  const std::optional<SpecialToken>& bos() const override { return bos_; }
  const std::optional<SpecialToken>& eos() const override { return eos_; }

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
    bool lstrip;
    bool rstrip;
  };
  // A piece of the input: an added token (index into added_) or text between them.
  struct Section {
    std::string_view text;
    int added = -1;
  };
  HfTokenizer();
  std::vector<Section> SplitAddedTokens(std::string_view text) const;

  std::vector<std::string> id_to_text_;
  std::vector<bool> has_text_;
  std::vector<bool> special_;
  std::vector<AddedToken> added_;
  // A byte trie of the added tokens' texts: node index -> terminal added_ index (or -1).
  absl::flat_hash_map<uint64_t, int32_t> trie_children_;  // key: node << 8 | byte
  std::vector<int32_t> trie_terminal_;
  bool trie_first_byte_[256] = {};
  absl::flat_hash_set<std::string> added_texts_;

  std::unique_ptr<internal::Normalizer> normalizer_;
  std::unique_ptr<internal::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<internal::BpeModel> model_;
  std::unique_ptr<internal::PostProcessor> post_processor_;
  std::unique_ptr<internal::Decoder> decoder_;
  bool clean_up_tokenization_spaces_ = true;
  std::optional<SpecialToken> bos_;
  std::optional<SpecialToken> eos_;
};

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_HF_TOKENIZER_H_
