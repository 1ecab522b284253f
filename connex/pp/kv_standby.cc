#include "connex/pp/kv_standby.h"

#include <algorithm>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::pp {

absl::StatusOr<std::unique_ptr<KvStandby>> KvStandby::Create(KvStandbyOptions options,
                                                             Engine& engine,
                                                             transport::TransferEngine& transfer,
                                                             MirrorSender::Self self,
                                                             MirrorSender::SendSignal send) {
  if (!engine.ExportsState()) {
    return absl::FailedPreconditionError(
        StrCat("pp ", options.self.ToString(),
               ": CONNEX_PP_KV_STANDBY=on needs an engine that exports its state "
               "(Engine::ExportsState); this one does not"));
  }
  std::unique_ptr<KvStandby> k(new KvStandby(std::move(options), engine, transfer, self, send));
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<SendRing> ring,
                          SendRing::Create(transfer, static_cast<size_t>(k->o_.slots),
                                           static_cast<size_t>(k->o_.slot_bytes)));
  MirrorSenderOptions so;
  so.ack_timeout_ms = k->o_.ack_timeout_ms;
  so.interval_ms = k->o_.interval_ms;
  so.clock = k->o_.clock;
  so.first_corr = k->o_.first_corr;
  k->sender_ = std::make_unique<MirrorSender>(so, std::move(ring), engine, std::move(self), send);
  MirrorStoreOptions mo;
  mo.self = k->o_.self;
  mo.slot_bytes = k->o_.slot_bytes;
  mo.budget_bytes = k->o_.budget_bytes;
  mo.orphan_grace_ms = k->o_.orphan_grace_ms;
  mo.handoff = k->o_.handoff;
  CONNEX_ASSIGN_OR_RETURN(k->store_, MirrorStore::Create(mo, transfer, std::move(send)));
  return k;
}

int64_t KvStandby::TakeOver(const OwnerKey& owner, uint64_t id, uint64_t local, int64_t upto) {
  if (store_->Held(owner, id) == 0) return 0;
  return store_->TakeOver(owner, id, local, upto, engine_);
}

void KvStandby::Ran(const StepSignal& step, const std::vector<uint64_t>& owner_ids,
                    const std::vector<uint64_t>& local_ids, const std::vector<int64_t>& starts,
                    const std::vector<int64_t>& positions) {
  CONNEX_CHECK(owner_ids.size() == local_ids.size() && starts.size() == owner_ids.size() &&
               positions.size() == owner_ids.size());
  if (step.has_handoff()) {
    // PD: a prefill instance's step; its requests' state goes to the decode instance named.
    MirrorSender* to = HandoffTo(step.handoff);
    const OwnerKey owner{step.owner.lid, step.owner_token};
    const int64_t now = NowMs();
    for (size_t i = 0; i < owner_ids.size(); ++i) {
      Retained& r = retained_[Key{owner, owner_ids[i]}];
      if (r.target != step.handoff.lid && !r.target.model.empty()) {
        // Handed to another decode instance now (the first one lost it): the old one drops it.
        auto old = handoffs_.find(r.target);
        if (old != handoffs_.end()) old->second->Forget(owner, {owner_ids[i]});
      }
      r.target = step.handoff.lid;
      r.positions = positions[i];
      r.last_ms = now;
      if (bytes_per_position_ == 0 && positions[i] > 0) {
        absl::StatusOr<TensorDict> one = engine_.ExportState(local_ids[i], 0, 1);
        if (one.ok()) bytes_per_position_ = static_cast<int64_t>(PackedSize(*one));
      }
      if (to != nullptr) {
        to->Ran(step.owner, step.owner_token, owner_ids[i], local_ids[i], starts[i], positions[i]);
      }
    }
    return;
  }
  for (size_t i = 0; i < owner_ids.size(); ++i) {
    sender_->Ran(step.owner, step.owner_token, owner_ids[i], local_ids[i], starts[i], positions[i]);
  }
}

void KvStandby::Released(const OwnerKey& owner, const std::vector<uint64_t>& ids) {
  sender_->Forget(owner, ids);
  store_->Released(owner, ids);
  ForgetRetained(owner, ids);
}

void KvStandby::ForgetRetained(const OwnerKey& owner, const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    auto it = retained_.find(Key{owner, id});
    if (it == retained_.end()) continue;
    auto to = handoffs_.find(it->second.target);
    if (to != handoffs_.end()) to->second->Forget(owner, {id});
    retained_.erase(it);
  }
}

void KvStandby::OwnerGone(const Lid& lid, uint64_t epoch) {
  sender_->ForgetOwner(lid, epoch);
  store_->OwnerGone(lid, epoch);
  for (auto& [target, to] : handoffs_) to->ForgetOwner(lid, epoch);
  for (auto it = retained_.begin(); it != retained_.end();) {
    it = it->first.first.lid == lid ? retained_.erase(it) : std::next(it);
  }
}

MirrorSender* KvStandby::HandoffTo(const Hop& target) {
  auto it = handoffs_.find(target.lid);
  if (it != handoffs_.end()) {
    it->second->SetStandby(target);  // a new epoch (a restart) starts its mirrors from 0
    return it->second.get();
  }
  absl::StatusOr<std::unique_ptr<SendRing>> ring = SendRing::Create(
      transfer_, static_cast<size_t>(o_.slots), static_cast<size_t>(o_.slot_bytes));
  if (!ring.ok()) {
    CONNEX_LOG_ERROR("pp {}: no ring for a handoff to {}: {}", o_.self.ToString(),
                     target.lid.ToString(), AsStd(ring.status().message()));
    return nullptr;
  }
  MirrorSenderOptions so;
  // A lost update is sent again well within the time its RESULT is held (half the step
  // timeout), so that a lost MIRROR or MIRRORED costs a retry, not a resume.
  so.ack_timeout_ms = std::max<int64_t>(1, o_.ack_timeout_ms / 4);
  so.interval_ms = 0;  // a handoff is on the request's path: at once
  so.what = "PD handoffs to";
  so.clock = o_.clock;
  // Correlation ids of their own, apart from the standby's and each other's.
  so.first_corr = o_.first_corr + (++handoff_senders_made_ << 40);
  auto sender = std::make_unique<MirrorSender>(so, *std::move(ring), engine_, self_, send_);
  sender->SetStandby(target);
  return (handoffs_[target.lid] = std::move(sender)).get();
}

std::optional<int64_t> KvStandby::HandedOver(const OwnerKey& owner, uint64_t id) const {
  auto r = retained_.find(Key{owner, id});
  if (r == retained_.end()) return std::nullopt;
  auto to = handoffs_.find(r->second.target);
  if (to == handoffs_.end()) return std::nullopt;
  return to->second->Confirmed(owner, id);
}

void KvStandby::HandoffTargetGone(const Lid& lid) {
  auto it = handoffs_.find(lid);
  if (it == handoffs_.end()) return;
  const MirrorSenderStats& gone = it->second->stats();
  handoffs_gone_.updates_sent += gone.updates_sent;
  handoffs_gone_.bytes_sent += gone.bytes_sent;
  handoffs_.erase(it);
}

std::vector<std::pair<OwnerKey, uint64_t>> KvStandby::RetentionExpired(int64_t now_ms,
                                                                       int64_t retain_ms,
                                                                       int64_t retain_bytes) {
  std::vector<std::pair<OwnerKey, uint64_t>> out;
  std::vector<std::pair<int64_t, Key>> by_age;
  int64_t bytes = 0;
  for (const auto& [key, r] : retained_) {
    if (now_ms - r.last_ms > retain_ms) {
      out.push_back(key);
      continue;
    }
    by_age.emplace_back(r.last_ms, key);
    bytes += r.positions * bytes_per_position_;
  }
  std::sort(by_age.begin(), by_age.end());
  for (const auto& [last_ms, key] : by_age) {
    if (bytes <= retain_bytes) break;
    bytes -= retained_[key].positions * bytes_per_position_;
    out.push_back(key);
  }
  retention_expired_ += out.size();
  return out;
}

size_t KvStandby::in_flight() const {
  size_t n = sender_->in_flight();
  for (const auto& [target, to] : handoffs_) n += to->in_flight();
  return n;
}

KvStandbyStats KvStandby::stats() const {
  KvStandbyStats s{sender_->stats(), store_->stats()};
  s.handoff_updates = handoffs_gone_.updates_sent;
  s.handoff_bytes = handoffs_gone_.bytes_sent;
  for (const auto& [target, to] : handoffs_) {
    s.handoff_updates += to->stats().updates_sent;
    s.handoff_bytes += to->stats().bytes_sent;
  }
  s.retained = retained_.size();
  for (const auto& [key, r] : retained_) s.retained_bytes += r.positions * bytes_per_position_;
  s.retention_expired = retention_expired_;
  return s;
}

void KvStandby::Choose(const std::vector<directory::Record>& live) {
  std::optional<directory::Record> next = NextReplicaAfter(live, o_.self.replica);
  sender_->SetStandby(next ? std::optional<Hop>(HopFromRecord(*next)) : std::nullopt);
}

void KvStandby::Turn(int64_t now_ms) {
  sender_->Expire(now_ms);
  sender_->Flush();
  for (auto& [target, to] : handoffs_) {
    to->Expire(now_ms);
    to->Flush();
  }
  store_->Tick(now_ms);
}

bool KvStandby::OnMirrored(const MirroredSignal& m) {
  for (auto& [target, to] : handoffs_) {
    if (to->Awaits(m.corr)) return to->OnMirrored(m);
  }
  return sender_->OnMirrored(m);
}

int64_t KvStandby::NextDeadline(int64_t otherwise) const {
  int64_t next = sender_->NextDeadline(otherwise);
  for (const auto& [target, to] : handoffs_) next = to->NextDeadline(next);
  return next;
}

}  // namespace connex::pp
