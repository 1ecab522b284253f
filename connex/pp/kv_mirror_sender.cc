#include "connex/pp/kv_mirror_sender.h"

#include <algorithm>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::pp {

size_t LagBucket(int64_t lag) {
  if (lag <= 2) return static_cast<size_t>(std::max<int64_t>(lag, 0));
  if (lag <= 4) return 3;
  if (lag <= 8) return 4;
  if (lag <= 16) return 5;
  return 6;
}

const char* LagBucketName(size_t bucket) {
  static const char* const kNames[kLagBuckets] = {"0", "1", "2", "3-4", "5-8", "9-16", "17+"};
  return bucket < kLagBuckets ? kNames[bucket] : "?";
}

MirrorSender::MirrorSender(MirrorSenderOptions options, std::unique_ptr<SendRing> ring,
                           Engine& engine, Self self, SendSignal send)
    : o_(std::move(options)),
      clock_(o_.clock != nullptr ? o_.clock : RealClock::Get()),
      ring_(std::move(ring)),
      engine_(engine),
      self_(std::move(self)),
      send_(std::move(send)),
      next_corr_(o_.first_corr) {}

void MirrorSender::SetStandby(const std::optional<Hop>& standby) {
  const bool same =
      standby.has_value() == standby_.has_value() &&
      (!standby || (standby->lid == standby_->lid && standby->epoch == standby_->epoch));
  if (same) {
    if (standby) standby_ = standby;  // its addresses may have changed (a migration)
    return;
  }
  ++stats_.standby_changes;
  CONNEX_LOG_INFO(
      "pp {}: {} {}", self_().lid.ToString(), o_.what,
      standby ? StrCat(standby->lid.ToString(), " epoch ", standby->epoch) : std::string("none"));
  if (standby_) {
    // The old standby (if it lives on) drops what it mirrored of ours.
    std::map<OwnerKey, std::vector<uint64_t>> by_owner;
    for (const auto& [key, t] : tracks_) {
      if (t.mirrored > 0 || t.in_flight != 0) by_owner[key.first].push_back(key.second);
    }
    const Hop me = self_();
    for (auto& [owner, ids] : by_owner) {
      send_(standby_->signal, MirrorDropSignal{me.lid, me.epoch, owner.lid, owner.token, ids});
    }
  }
  std::vector<uint64_t> corrs;
  for (const auto& [corr, out] : outgoing_) corrs.push_back(corr);
  for (uint64_t corr : corrs) Free(corr);
  for (auto& [key, t] : tracks_) {
    t.mirrored = 0;  // the new standby holds nothing
    t.stopped = false;
  }
  standby_ = standby;
}

void MirrorSender::Ran(const Hop& owner, uint64_t owner_token, uint64_t id, uint64_t local,
                       int64_t start, int64_t positions) {
  CONNEX_CHECK(start >= 0 && positions > start);
  Track& t = tracks_[Key{OwnerKey{owner.lid, owner_token}, id}];
  if (standby_) stats_.lag[LagBucket(start - t.mirrored)]++;
  t.owner = owner;
  t.local = local;
  t.positions = positions;
  // A step from `start` rewrote what lies beyond it here: the standby's copy of it is stale.
  t.mirrored = std::min(t.mirrored, start);
  stats_.tracked = tracks_.size();
}

void MirrorSender::Forget(const OwnerKey& owner, const std::vector<uint64_t>& ids) {
  MirrorDropSignal d;
  for (uint64_t id : ids) {
    auto it = tracks_.find(Key{owner, id});
    if (it == tracks_.end()) continue;
    if (it->second.mirrored > 0 || it->second.in_flight != 0) d.request_ids.push_back(id);
    tracks_.erase(it);
  }
  stats_.tracked = tracks_.size();
  if (!standby_ || d.request_ids.empty()) return;
  const Hop me = self_();
  d.from = me.lid;
  d.from_epoch = me.epoch;
  d.owner = owner.lid;
  d.owner_token = owner.token;
  send_(standby_->signal, d);
}

void MirrorSender::ForgetOwner(const Lid& lid, uint64_t epoch) {
  for (auto it = tracks_.begin(); it != tracks_.end();) {
    auto next = std::next(it);
    if (it->first.first.lid == lid && it->second.owner.epoch <= epoch) tracks_.erase(it);
    it = next;
  }
  stats_.tracked = tracks_.size();
}

void MirrorSender::Flush() {
  if (!standby_) return;
  // At most one round of updates per interval: each update costs both sides a signal and the
  // standby a read, whatever it carries; between rounds the rows accumulate.
  const int64_t now = NowMs();
  if (o_.interval_ms > 0 && now - last_flush_ms_ < o_.interval_ms) return;
  last_flush_ms_ = now;
  // Due: held here beyond what the standby confirmed, nothing in flight; one update per owner.
  std::map<OwnerKey, std::vector<Key>> due;
  for (const auto& [key, t] : tracks_) {
    if (!t.stopped && t.in_flight == 0 && t.positions > t.mirrored) due[key.first].push_back(key);
  }
  for (const auto& [owner, keys] : due) {
    if (!SendUpdate(keys)) break;  // no free slot: the rest waits for the next turn
  }
}

bool MirrorSender::SendUpdate(const std::vector<Key>& keys) {
  const uint64_t corr = next_corr_++;
  std::optional<uint32_t> slot = ring_->Acquire(corr);
  if (!slot) return false;
  const uint64_t capacity = ring_->payload_capacity();
  // An upper bound of the packed size: every tensor 64-byte aligned.
  auto bound = [](const TensorDict& d) {
    uint64_t b = 0;
    for (const auto& [name, t] : d.tensors()) b += (t.data.size() + 63) / 64 * 64;
    return b;
  };
  uint64_t used = 0;
  MirrorSignal m;
  TensorDict payload;
  Outgoing out;
  for (const Key& key : keys) {
    Track& t = tracks_[key];
    int64_t rows = t.positions - t.mirrored;
    // As many positions as fit what is left of the slot (halved until they do).
    while (rows > 0) {
      absl::StatusOr<TensorDict> state =
          engine_.ExportState(t.local, t.mirrored, t.mirrored + rows);
      if (!state.ok()) {
        ++stats_.export_errors;
        CONNEX_LOG_WARN("pp {}: request {} is not mirrored: {}", self_().lid.ToString(), key.second,
                        AsStd(state.status().message()));
        t.stopped = true;
        rows = 0;
        break;
      }
      const uint64_t size = bound(*state);
      if (used + size <= capacity) {
        used += size;
        const size_t index = m.request_ids.size();
        for (auto& [name, tensor] : state->tensors()) {
          payload.Set(StrCat(index, "/", name), tensor);
        }
        break;
      }
      rows /= 2;
    }
    if (rows == 0) continue;
    m.request_ids.push_back(key.second);
    m.from.push_back(static_cast<int32_t>(t.mirrored));
    m.to.push_back(static_cast<int32_t>(t.mirrored + rows));
    m.owner = t.owner;
    t.in_flight = corr;
    out.keys.push_back(key);
  }
  if (m.request_ids.empty()) {
    ring_->Release(corr);
    return true;  // nothing of these fit or exported; other owners may
  }
  const uint64_t size = PackedSize(payload);
  m.layout = Pack(payload, ring_->payload(*slot));
  ring_->Seal(*slot, corr, size);
  m.corr = corr;
  m.origin = self_();
  m.target = standby_->lid;
  m.target_epoch = standby_->epoch;
  m.owner_token = keys.front().first.token;
  m.remote_addr = ring_->remote_addr(*slot);
  m.length = size;
  out.target = standby_->lid;
  out.deadline = NowMs() + o_.ack_timeout_ms;
  outgoing_[corr] = std::move(out);
  ++stats_.updates_sent;
  stats_.bytes_sent += size;
  send_(standby_->signal, m);
  return true;
}

void MirrorSender::Free(uint64_t corr) {
  auto it = outgoing_.find(corr);
  if (it == outgoing_.end()) return;
  for (const Key& key : it->second.keys) {
    auto t = tracks_.find(key);
    if (t != tracks_.end() && t->second.in_flight == corr) t->second.in_flight = 0;
  }
  outgoing_.erase(it);
  ring_->Release(corr);
}

bool MirrorSender::OnMirrored(const MirroredSignal& m) {
  auto it = outgoing_.find(m.corr);
  if (it == outgoing_.end()) return true;  // late or duplicated
  if (it->second.target != m.from) return false;
  if (m.code != 0) {
    ++stats_.refused;
    CONNEX_LOG_DEBUG("pp {}: KV standby refused an update: {}", self_().lid.ToString(), m.message);
    Free(m.corr);
    return true;
  }
  const OwnerKey owner = it->second.keys.empty() ? OwnerKey{} : it->second.keys.front().first;
  for (size_t i = 0; i < m.request_ids.size() && i < m.held.size(); ++i) {
    auto t = tracks_.find(Key{owner, m.request_ids[i]});
    if (t == tracks_.end() || t->second.in_flight != m.corr) continue;
    if (m.held[i] < 0) {
      if (!t->second.stopped) ++stats_.stopped;
      t->second.stopped = true;
    } else {
      // What the standby holds (less than sent: it lost an update and says from where).
      t->second.mirrored = std::min<int64_t>(m.held[i], t->second.positions);
    }
  }
  Free(m.corr);
  return true;
}

void MirrorSender::Expire(int64_t now_ms) {
  std::vector<uint64_t> expired;
  for (const auto& [corr, out] : outgoing_) {
    if (out.deadline <= now_ms) expired.push_back(corr);
  }
  stats_.expired += expired.size();
  for (uint64_t corr : expired) Free(corr);
}

int64_t MirrorSender::NextDeadline(int64_t otherwise) const {
  int64_t next = otherwise;
  for (const auto& [corr, out] : outgoing_) next = std::min(next, out.deadline);
  return next;
}

std::optional<int64_t> MirrorSender::Confirmed(const OwnerKey& owner, uint64_t id) const {
  auto it = tracks_.find(Key{owner, id});
  if (it == tracks_.end()) return std::nullopt;
  return it->second.stopped ? -1 : it->second.mirrored;
}

}  // namespace connex::pp
