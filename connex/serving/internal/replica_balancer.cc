#include "connex/serving/internal/replica_balancer.h"

#include <algorithm>

#include "connex/base/check.h"

namespace connex::serving::internal {

std::optional<Replica> ReplicaBalancer::Pick(const std::vector<Replica>& replicas,
                                             std::string_view avoid, Clock::time_point now) {
  const Replica* best = nullptr;
  auto better = [&](const Replica& r) {
    if (best == nullptr) return true;
    const bool r_avoided = r.name == avoid;
    const bool best_avoided = best->name == avoid;
    if (r_avoided != best_avoided) return best_avoided;
    return inflight(r.name) < inflight(best->name);
  };
  for (const Replica& r : replicas) {
    if (!Up(r.name, now)) continue;
    if (better(r)) best = &r;
  }
  if (best == nullptr) {
    for (const Replica& r : replicas) {
      auto it = state_.find(r.name);
      if (it != state_.end() && it->second.connect_failures == 0 && better(r)) best = &r;
    }
  }
  // Forget the state of replicas that left.
  for (auto it = state_.begin(); it != state_.end();) {
    const bool known = std::any_of(replicas.begin(), replicas.end(),
                                   [&](const Replica& r) { return r.name == it->first; });
    it = known || it->second.inflight > 0 ? std::next(it) : state_.erase(it);
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

std::optional<ReplicaBalancer::Clock::time_point> ReplicaBalancer::NextUp(
    const std::vector<Replica>& replicas) const {
  std::optional<Clock::time_point> next;
  for (const Replica& r : replicas) {
    auto it = state_.find(r.name);
    if (it == state_.end()) continue;
    if (!next || it->second.down_until < *next) next = it->second.down_until;
  }
  return next;
}

void ReplicaBalancer::Ended(const std::string& name) {
  auto it = state_.find(name);
  if (it == state_.end()) return;
  CONNEX_CHECK(it->second.inflight > 0);  // an attempt ends once, after it started
  --it->second.inflight;
}

void ReplicaBalancer::Failed(const std::string& name, bool connect, Clock::time_point now) {
  State& s = state_[name];
  int64_t down_ms = kReplicaDownMs;
  if (connect) {
    ++s.connect_failures;
    down_ms = std::min(kMaxReplicaDownMs, kReplicaDownMs << std::min(s.connect_failures - 1, 8));
  }
  s.down_until = std::max(s.down_until, now + std::chrono::milliseconds(down_ms));
}

int ReplicaBalancer::inflight(const std::string& name) const {
  auto it = state_.find(name);
  return it == state_.end() ? 0 : it->second.inflight;
}

bool ReplicaBalancer::Up(const std::string& name, Clock::time_point now) const {
  auto it = state_.find(name);
  return it == state_.end() || it->second.down_until <= now;
}

}  // namespace connex::serving::internal
