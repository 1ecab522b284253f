#include "connex/pp/release_queue.h"

#include <algorithm>

namespace connex::pp {

ReleaseQueue::ReleaseQueue(ReleaseQueueOptions options, CurrentAddress current, SendSignal send)
    : o_(std::move(options)),
      current_(std::move(current)),
      send_(std::move(send)),
      next_nonce_(o_.first_nonce) {}

void ReleaseQueue::Add(uint64_t id, const std::map<Lid, std::string>& stages) {
  for (const auto& [stage, last_address] : stages) {
    // Not live now may still mean alive: a stage wrongly evicted (a lost probe) rejoins with
    // its state, so it is told at its last address too.
    std::optional<std::string> now = current_(stage);
    auto& [address, ids] = unsent_[stage];
    address = now ? *now : last_address;
    ids.insert(id);
  }
}

void ReleaseQueue::Flush(int64_t now_ms, uint64_t upto_step, const std::string& reply_to) {
  for (auto& [stage, entry] : unsent_) {
    if (entry.second.empty() || entry.first.empty()) continue;
    InFlight f;
    f.stage = stage;
    f.address = entry.first;
    f.ids.assign(entry.second.begin(), entry.second.end());
    f.upto_step = upto_step;
    in_flight_.emplace(next_nonce_++, std::move(f));
  }
  unsent_.clear();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    InFlight& f = it->second;
    if (f.next_at > now_ms) {
      ++it;
      continue;
    }
    if (f.attempts >= o_.max_attempts) {
      it = in_flight_.erase(it);
      continue;
    }
    if (std::optional<std::string> now = current_(f.stage)) f.address = *now;  // it may have moved
    ++f.attempts;
    f.next_at = now_ms + std::min<int64_t>(o_.max_backoff_ms, 50 << std::min(f.attempts, 6));
    send_(f.address,
          ReleaseSignal{o_.owner, f.ids, o_.owner_token, it->first, reply_to, f.upto_step});
    ++it;
  }
}

bool ReleaseQueue::OnReleased(const ReleasedSignal& released) {
  auto it = in_flight_.find(released.nonce);
  if (it == in_flight_.end() || it->second.stage != released.from) return false;
  in_flight_.erase(it);
  return true;
}

size_t ReleaseQueue::pending() const {
  size_t n = 0;
  for (const auto& [nonce, f] : in_flight_) n += f.ids.size();
  for (const auto& [stage, entry] : unsent_) n += entry.second.size();
  return n;
}

}  // namespace connex::pp
