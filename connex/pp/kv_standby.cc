#include "connex/pp/kv_standby.h"

#include "connex/base/check.h"
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
  std::unique_ptr<KvStandby> k(new KvStandby(std::move(options), engine));
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
  for (size_t i = 0; i < owner_ids.size(); ++i) {
    sender_->Ran(step.owner, step.owner_token, owner_ids[i], local_ids[i], starts[i], positions[i]);
  }
}

void KvStandby::Released(const OwnerKey& owner, const std::vector<uint64_t>& ids) {
  sender_->Forget(owner, ids);
  store_->Released(owner, ids);
}

void KvStandby::OwnerGone(const Lid& lid, uint64_t epoch) {
  sender_->ForgetOwner(lid, epoch);
  store_->OwnerGone(lid, epoch);
}

void KvStandby::Choose(const std::vector<directory::Record>& live) {
  std::optional<directory::Record> next = NextReplicaAfter(live, o_.self.replica);
  sender_->SetStandby(next ? std::optional<Hop>(HopFromRecord(*next)) : std::nullopt);
}

void KvStandby::Turn(int64_t now_ms) {
  sender_->Expire(now_ms);
  sender_->Flush();
  store_->Tick(now_ms);
}

}  // namespace connex::pp
