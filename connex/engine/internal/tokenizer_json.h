// tokenizer.json, parsed once with simdjson. A BPE model's vocabulary and merges — most of the file
// (Llama 3's: 128K tokens and 280K merges in 9 MB) — are read from simdjson's document straight
// into their containers; every other field (the model's options, the added tokens, the pipeline's
// components: a few KB) is converted to an nlohmann::json for the components' readers. nlohmann's
// DOM of the whole file took most of a tokenizer's load (docs/design/tokenizer.md, "Performance").
// Not thread-safe; the tokenizer's loader uses one per load.
#ifndef CONNEX_ENGINE_INTERNAL_TOKENIZER_JSON_H_
#define CONNEX_ENGINE_INTERNAL_TOKENIZER_JSON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace connex::engine::internal {

class TokenizerJson {
 public:
  // InvalidArgument "<name>: not valid JSON: <why>" unless `text` is one JSON object.
  static absl::StatusOr<std::unique_ptr<TokenizerJson>> Parse(std::string_view text,
                                                              const std::string& name);
  ~TokenizerJson();

  // The document without model.vocab when it is an object and model.merges when it is an array.
  const nlohmann::json& rest() const;
  // Whether model.vocab is an object and model.merges an array (a BPE model's tables).
  bool has_bpe_tables() const;
  // model.vocab: token text -> id (a later duplicate wins). InvalidArgument naming the token
  // whose id is not an integer in [0, 2^31).
  absl::StatusOr<absl::flat_hash_map<std::string, int32_t>> Vocab() const;
  // model.merges, each a "left right" string (its first two space-separated parts) or a
  // [left, right] pair of strings. InvalidArgument naming the first that is neither.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Merges() const;

 private:
  struct Impl;
  explicit TokenizerJson(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace connex::engine::internal

#endif  // CONNEX_ENGINE_INTERNAL_TOKENIZER_JSON_H_
