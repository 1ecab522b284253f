// The BPE model of tokenizer.json: a vocabulary, ranked merges, and what to do with a piece that
// is not in the vocabulary (byte fallback to `<0xXX>` tokens, or the unknown token). Words are
// merged lowest rank first, leftmost first among equal ranks, as the Hugging Face and
// transformers.js implementations do. Thread-safe: the model is immutable except for a cache of
// merged words behind a mutex.
#ifndef CONNEX_ENGINE_INTERNAL_BPE_H_
#define CONNEX_ENGINE_INTERNAL_BPE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "connex/base/mutex.h"

namespace connex::engine::internal {

struct BpeOptions {
  // Pieces missing from the vocabulary become their UTF-8 bytes as `<0xXX>` tokens (when all of
  // those are in the vocabulary).
  bool byte_fallback = false;
  // Consecutive unknown tokens become one.
  bool fuse_unk = false;
  // A word that is itself in the vocabulary is one token, whatever the merges would make of it.
  bool ignore_merges = false;
  // The unknown token's id, if the model has one.
  std::optional<int32_t> unk_id;
};

class BpeModel {
 public:
  // `vocab` maps token text to id (the model's vocabulary with the added tokens over it);
  // `merges` are the merge pairs in rank order (a pair listed twice keeps its last rank).
  BpeModel(absl::flat_hash_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  // Appends the ids of `words` (each merged on its own) to `out`, then fuses unknown tokens.
  // InvalidArgument if a piece is not in the vocabulary and there is no unknown token.
  absl::Status Encode(const std::vector<std::string>& words, std::vector<int32_t>* out) const;

  // The id of `token`, if it is in the vocabulary.
  std::optional<int32_t> TokenId(std::string_view token) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // the symbol of the merged pair
  };
  absl::Status EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  absl::Status AppendUnknown(std::string_view piece, std::vector<int32_t>* out) const;
  int32_t Intern(std::string_view text);

  // Token text to symbol: a vocabulary id, or (for the parts and results of merges that are not
  // in the vocabulary) a symbol at or above `first_extra_`.
  absl::flat_hash_map<std::string, int32_t> symbols_;
  int32_t first_extra_ = 0;
  absl::flat_hash_map<uint64_t, Merge> merges_;  // key: left symbol << 32 | right symbol
  BpeOptions options_;
  int32_t byte_ids_[256];  // the `<0xXX>` tokens, -1 where absent

  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 17;
  mutable connex::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace connex::engine::internal

#endif  // CONNEX_ENGINE_INTERNAL_BPE_H_
