// KvStandby: a stage's KV standby, both ways (docs/design/step-protocol.md, "KV standby"). As a
// primary it mirrors the state its engine appends at every step to its standby — the live
// replica of its stage after its own (MirrorSender); as a standby it keeps the mirrors of the
// primaries whose standby it is (MirrorStore) and, when an owner's re-sent step of such a
// request arrives, imports the mirror so that the step runs without a re-prefill
// (StepReceiver asks through StandbyHooks). The owner's route picks the same replica when a
// hop dies (RouteTable::Build), so the standby is where the re-sent steps go. Stage 0 keeps no
// standby (its requests live and die with their owner). Thread-compatible: owned by a
// StageNode's loop thread.
#ifndef CONNEX_PP_KV_STANDBY_H_
#define CONNEX_PP_KV_STANDBY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/directory/protocol.h"
#include "connex/pp/kv_mirror_sender.h"
#include "connex/pp/kv_mirror_store.h"
#include "connex/pp/route_table.h"
#include "connex/pp/step_receiver.h"

namespace connex::pp {

struct KvStandbyOptions {
  Lid self;
  int slots = 4;                              // the mirrors' ring
  int64_t slot_bytes = 8 << 20;               // CONNEX_PP_SLOT_BYTES
  int64_t budget_bytes = int64_t{256} << 20;  // CONNEX_PP_KV_STANDBY_BYTES
  int64_t orphan_grace_ms = 10000;            // mirrors of a failed primary kept this long
  int64_t ack_timeout_ms = 5000;
  int64_t interval_ms = 0;  // CONNEX_PP_KV_STANDBY_INTERVAL_MS
  Clock* clock = nullptr;
  uint64_t first_corr = 1;
};

struct KvStandbyStats {
  MirrorSenderStats primary;
  MirrorStoreStats standby;
};

class KvStandby final : public StandbyHooks {
 public:
  // FailedPrecondition when `engine` does not export state (Engine::ExportsState).
  static absl::StatusOr<std::unique_ptr<KvStandby>> Create(KvStandbyOptions options, Engine& engine,
                                                           transport::TransferEngine& transfer,
                                                           MirrorSender::Self self,
                                                           MirrorSender::SendSignal send);

  // StandbyHooks (StepReceiver).
  int64_t TakeOver(const OwnerKey& owner, uint64_t id, uint64_t local, int64_t upto) override;
  void Ran(const StepSignal& step, const std::vector<uint64_t>& owner_ids,
           const std::vector<uint64_t>& local_ids, const std::vector<int64_t>& starts,
           const std::vector<int64_t>& positions) override;
  void Released(const OwnerKey& owner, const std::vector<uint64_t>& ids) override;
  void OwnerGone(const Lid& lid, uint64_t epoch) override;

  // Signals.
  void OnMirror(const MirrorSignal& m, uint64_t epoch, int64_t now_ms) {
    store_->OnMirror(m, epoch, now_ms);
  }
  bool OnMirrored(const MirroredSignal& m) { return sender_->OnMirrored(m); }
  void OnDrop(const MirrorDropSignal& d) { store_->OnDrop(d); }

  // The live members of this stage now: the standby is the replica after ours.
  void Choose(const std::vector<directory::Record>& live);
  // A member of this stage failed: the mirrors it sent wait for re-sent steps a grace period.
  void PrimaryGone(const Lid& lid, uint64_t epoch, int64_t now_ms) {
    store_->PrimaryGone(lid, epoch, now_ms);
  }
  // Each turn of the loop: updates not answered in time, updates due, mirrors past their grace.
  void Turn(int64_t now_ms);
  int64_t NextDeadline(int64_t otherwise) const { return sender_->NextDeadline(otherwise); }
  // Mirror updates sent and not answered yet (a draining stage waits for them).
  size_t in_flight() const { return sender_->in_flight(); }

  KvStandbyStats stats() const { return {sender_->stats(), store_->stats()}; }

 private:
  KvStandby(KvStandbyOptions options, Engine& engine) : o_(std::move(options)), engine_(engine) {}

  const KvStandbyOptions o_;
  Engine& engine_;
  std::unique_ptr<MirrorSender> sender_;
  std::unique_ptr<MirrorStore> store_;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_KV_STANDBY_H_
