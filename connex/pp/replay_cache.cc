#include "connex/pp/replay_cache.h"

namespace connex::pp {

uint64_t ReplayCache::BytesOf(const TensorDict& d) {
  uint64_t n = 0;
  for (const auto& [name, t] : d.tensors()) n += t.data.size() + name.size() + 64;
  return n;
}

void ReplayCache::Erase(const StepKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  bytes_ -= BytesOf(it->second.output);
  entries_.erase(it);
}

void ReplayCache::Put(const StepKey& key, TensorDict output) {
  Erase(key);
  uint64_t size = BytesOf(output);
  if (size > max_bytes_) return;
  bytes_ += size;
  uint64_t seq = next_seq_++;
  entries_.emplace(key, Entry{std::move(output), seq});
  order_.emplace_back(seq, key);
  while (!order_.empty() && (entries_.size() > max_entries_ || bytes_ > max_bytes_ ||
                             order_.size() > 2 * max_entries_ + 16)) {
    auto [oldest_seq, oldest] = order_.front();
    order_.pop_front();
    auto it = entries_.find(oldest);
    if (it != entries_.end() && it->second.seq == oldest_seq) Erase(oldest);
  }
}

const TensorDict* ReplayCache::Find(const StepKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second.output;
}

}  // namespace connex::pp
