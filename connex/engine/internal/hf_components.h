// The pipeline stages of tokenizer.json other than the model: normalizers, pre-tokenizers,
// post-processors and decoders, each built from its JSON object by a factory that refuses (with
// the component's type in the message) what it does not implement. They behave as
// transformers.js's do, the reference the tests compare with. Thread-safe: immutable once built.
#ifndef CONNEX_ENGINE_INTERNAL_HF_COMPONENTS_H_
#define CONNEX_ENGINE_INTERNAL_HF_COMPONENTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace connex::engine::internal {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::Status Normalize(std::string* text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokens. `section` is the index of the text's section among the
  // added-token splits (Metaspace's prepend_scheme "first" prepends to section 0 only).
  virtual absl::Status PreTokenize(std::vector<std::string>* pieces, int section) const = 0;
};

// Adds the template's special tokens around a sequence's ids.
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void Process(std::vector<int32_t>* ids, bool add_special_tokens) const = 0;
};

// What a decoder knows of the sequence around the tokens it is given.
struct DecodeContext {
  // The added tokens' texts (the byte-level decoder passes them through unchanged).
  const absl::flat_hash_set<std::string>* added_tokens = nullptr;
  // The tokens continue a sequence whose earlier text was produced already: effects on the start
  // of the text (Strip, Metaspace's first-token space) are not applied again.
  bool continuation = false;
  // An earlier Fuse joined the tokens into one text (Strip then acts on the text's start).
  bool fused = false;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Transforms the token texts in place (a decoder may join them into one).
  virtual void DecodeChain(std::vector<std::string>* tokens, const DecodeContext& ctx) const = 0;
  // Whether a stream may cut after `token`: false inside a run that the decoder turns into text
  // only as a whole (ByteFallback's `<0xXX>` runs).
  virtual bool CanCutAfter(std::string_view /*token*/) const { return true; }
};

// Looks up a token's id (for the special tokens of a template).
using TokenIdLookup = std::function<std::optional<int32_t>(std::string_view)>;

// Each returns nullptr for a JSON null (no such stage). `where` names the field for errors
// ("tokenizer.json: normalizer").
absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& j,
                                                           const std::string& where);
absl::StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const nlohmann::json& j,
                                                               const std::string& where);
absl::StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(const nlohmann::json& j,
                                                                 const std::string& where,
                                                                 const TokenIdLookup& lookup);
absl::StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& j,
                                                     const std::string& where);

}  // namespace connex::engine::internal

#endif  // CONNEX_ENGINE_INTERNAL_HF_COMPONENTS_H_
