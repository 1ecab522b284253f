#include "connex/engine/internal/bpe.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "connex/base/strings.h"
#include "connex/engine/internal/utf8.h"

namespace connex::engine::internal {
namespace {

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A symbol of a word being merged: a span of the word, linked to its live neighbours.
struct Symbol {
  int32_t id;  // -1: a character that is in no merge and not in the vocabulary
  uint32_t begin;
  uint32_t end;
  int32_t prev;
  int32_t next;
};

// A candidate merge of the symbol at `pos` with its next symbol.
struct Candidate {
  int32_t rank;
  int32_t pos;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

BpeModel::BpeModel(absl::flat_hash_map<std::string, int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options)
    : symbols_(std::move(vocab)), options_(options) {
  for (const auto& [text, id] : symbols_) first_extra_ = std::max(first_extra_, id + 1);
  // Sized once: a 280k-merge table grown by doubling re-inserted every merge about twice over
  // (what a process spends loading a 128k-vocabulary tokenizer is mostly here).
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    int32_t l = Intern(left);
    int32_t r = Intern(right);
    joined.assign(left).append(right);
    int32_t result = Intern(joined);
    merges_[PairKey(l, r)] = Merge{static_cast<int32_t>(rank), result};
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    std::optional<int32_t> id = TokenId(name);
    byte_ids_[b] = id ? *id : -1;
  }
}

int32_t BpeModel::Intern(std::string_view text) {
  // Almost every merge's parts are tokens already: look up without building a key.
  if (auto it = symbols_.find(AsAbsl(text)); it != symbols_.end()) return it->second;
  auto it = symbols_.try_emplace(std::string(text), 0).first;
  it->second = first_extra_ + static_cast<int32_t>(symbols_.size());
  return it->second;
}

std::optional<int32_t> BpeModel::TokenId(std::string_view token) const {
  auto it = symbols_.find(AsAbsl(token));
  if (it == symbols_.end() || it->second >= first_extra_) return std::nullopt;
  return it->second;
}

absl::Status BpeModel::Encode(const std::vector<std::string>& words,
                              std::vector<int32_t>* out) const {
  size_t first = out->size();
  for (const std::string& word : words) {
    if (absl::Status s = EncodeWord(word, out); !s.ok()) return s;
  }
  if (options_.fuse_unk && options_.unk_id) {
    int32_t unk = *options_.unk_id;
    auto end = std::unique(out->begin() + first, out->end(),
                           [unk](int32_t a, int32_t b) { return a == unk && b == unk; });
    out->erase(end, out->end());
  }
  return absl::OkStatus();
}

absl::Status BpeModel::AppendUnknown(std::string_view piece, std::vector<int32_t>* out) const {
  if (options_.byte_fallback) {
    bool all = std::all_of(piece.begin(), piece.end(), [this](char c) {
      return byte_ids_[static_cast<unsigned char>(c)] >= 0;
    });
    if (all) {
      for (char c : piece) out->push_back(byte_ids_[static_cast<unsigned char>(c)]);
      return absl::OkStatus();
    }
  }
  if (!options_.unk_id) {
    return absl::InvalidArgumentError(StrCat(
        "tokenizer: the piece \"", piece, "\" is not in the vocabulary and there is no unk_token"));
  }
  out->push_back(*options_.unk_id);
  return absl::OkStatus();
}

absl::Status BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return absl::OkStatus();
  if (options_.ignore_merges) {
    if (std::optional<int32_t> id = TokenId(word)) {
      out->push_back(*id);
      return absl::OkStatus();
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    connex::MutexLock lock(&cache_mu_);
    auto it = cache_.find(AsAbsl(word));
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }

  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t pos = 0; pos < word.size();) {
    size_t begin = pos;
    NextCodePoint(word, &pos);
    auto it = symbols_.find(AsAbsl(word.substr(begin, pos - begin)));
    int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{it == symbols_.end() ? -1 : it->second, static_cast<uint32_t>(begin),
                             static_cast<uint32_t>(pos), index - 1, index + 1});
  }
  symbols.back().next = -1;

  auto find_merge = [&](int32_t pos) -> const Merge* {
    const Symbol& s = symbols[pos];
    if (s.next < 0 || s.id < 0 || symbols[s.next].id < 0) return nullptr;
    auto it = merges_.find(PairKey(s.id, symbols[s.next].id));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) {
    if (const Merge* m = find_merge(i)) queue.push(Candidate{m->rank, i});
  }
  while (!queue.empty()) {
    Candidate c = queue.top();
    queue.pop();
    Symbol& s = symbols[c.pos];
    // Stale: the symbol was merged into its left neighbour, or its pair changed since.
    if (s.end == s.begin) continue;
    const Merge* m = find_merge(c.pos);
    if (m == nullptr || m->rank != c.rank) continue;
    Symbol& right = symbols[s.next];
    s.id = m->result;
    s.end = right.end;
    s.next = right.next;
    right.begin = right.end;  // dead
    if (s.next >= 0) symbols[s.next].prev = c.pos;
    if (s.prev >= 0) {
      if (const Merge* pm = find_merge(s.prev)) queue.push(Candidate{pm->rank, s.prev});
    }
    if (const Merge* nm = find_merge(c.pos)) queue.push(Candidate{nm->rank, c.pos});
  }

  std::vector<int32_t> ids;
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0 && s.id < first_extra_) {
      ids.push_back(s.id);
    } else if (absl::Status st = AppendUnknown(word.substr(s.begin, s.end - s.begin), &ids);
               !st.ok()) {
      return st;
    }
  }
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    connex::MutexLock lock(&cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
  return absl::OkStatus();
}

}  // namespace connex::engine::internal
