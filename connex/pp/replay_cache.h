// ReplayCache: the outputs a stage keeps so that a re-sent attempt of a step it already ran is
// answered without running the step again (a step never runs twice on a stage). Keyed by the
// owner's incarnation and the step id; bounded in entries and in bytes, oldest evicted first. A
// last stage keeps only what it sends on (the batch keys and the sampled tokens), never logits.
// Thread-compatible: owned by a StageNode's loop thread.
#ifndef CONNEX_PP_REPLAY_CACHE_H_
#define CONNEX_PP_REPLAY_CACHE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <tuple>

#include "connex/base/lid.h"
#include "connex/pp/tensor_dict.h"

namespace connex::pp {

struct StepKey {
  Lid owner;
  uint64_t owner_token = 0;
  uint64_t step = 0;
  friend auto operator<=>(const StepKey& a, const StepKey& b) {
    return std::tie(a.owner, a.owner_token, a.step) <=> std::tie(b.owner, b.owner_token, b.step);
  }
  friend bool operator==(const StepKey&, const StepKey&) = default;
};

class ReplayCache {
 public:
  ReplayCache(size_t max_entries, uint64_t max_bytes)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}

  // Keeps `output` for `key` (replacing an older one), then evicts the oldest entries until both
  // bounds hold. An output larger than the byte bound is not kept.
  void Put(const StepKey& key, TensorDict output);
  // The kept output, or nullptr.
  const TensorDict* Find(const StepKey& key) const;

  size_t size() const { return entries_.size(); }
  uint64_t bytes() const { return bytes_; }

 private:
  static uint64_t BytesOf(const TensorDict& d);
  void Erase(const StepKey& key);

  const size_t max_entries_;
  const uint64_t max_bytes_;
  struct Entry {
    TensorDict output;
    uint64_t seq = 0;  // matches the entry of order_ that is current
  };
  std::map<StepKey, Entry> entries_;
  std::deque<std::pair<uint64_t, StepKey>> order_;  // stale pairs (replaced keys) are skipped
  uint64_t next_seq_ = 1;
  uint64_t bytes_ = 0;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_REPLAY_CACHE_H_
