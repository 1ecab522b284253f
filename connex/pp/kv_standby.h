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
#include <map>
#include <memory>
#include <optional>
#include <utility>
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
  // A mirror's read may outlast the caller's hold on the loop (MirrorStoreOptions::handoff).
  internal::LoopHandoff handoff;
};

struct KvStandbyStats {
  MirrorSenderStats primary;
  MirrorStoreStats standby;
  // PD (a prefill instance): what went to decode instances, requests retained, and those whose
  // retention ran out (CONNEX_PD_RETAIN_MS / _BYTES).
  uint64_t handoff_updates = 0;
  uint64_t handoff_bytes = 0;
  size_t retained = 0;
  int64_t retained_bytes = 0;
  uint64_t retention_expired = 0;
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
  bool OnMirrored(const MirroredSignal& m);
  void OnDrop(const MirrorDropSignal& d) { store_->OnDrop(d); }

  // The live members of this stage now: the standby is the replica after ours.
  void Choose(const std::vector<directory::Record>& live);
  // A member of this stage failed: the mirrors it sent wait for re-sent steps a grace period.
  void PrimaryGone(const Lid& lid, uint64_t epoch, int64_t now_ms) {
    store_->PrimaryGone(lid, epoch, now_ms);
  }
  // Each turn of the loop: updates not answered in time, updates due, mirrors past their grace.
  void Turn(int64_t now_ms);
  int64_t NextDeadline(int64_t otherwise) const;
  // Mirror updates sent and not answered yet (a draining stage waits for them).
  size_t in_flight() const;

  // ---- PD: a prefill instance's handoffs (docs/design/pd.md) ----
  // A step that names a decode instance (StepSignal::handoff) has its requests' state mirrored
  // there — by a sender of its own per decode instance — instead of to a standby, and kept
  // (retained) after it. Positions of the owner's request `id` the decode instance confirmed
  // (-1: it dropped them for its budget; nullopt: no handoff of it is tracked).
  std::optional<int64_t> HandedOver(const OwnerKey& owner, uint64_t id) const;
  // The decode instance `lid` is gone: its handoffs stop (their requests wait for no answer).
  void HandoffTargetGone(const Lid& lid);
  // The retained requests past `retain_ms` since their last step, then the oldest past
  // `retain_bytes` in all: the caller drops their state (StepReceiver::Evict), which Releases
  // them here.
  std::vector<std::pair<OwnerKey, uint64_t>> RetentionExpired(int64_t now_ms, int64_t retain_ms,
                                                              int64_t retain_bytes);

  KvStandbyStats stats() const;

 private:
  KvStandby(KvStandbyOptions options, Engine& engine, transport::TransferEngine& transfer,
            MirrorSender::Self self, MirrorSender::SendSignal send)
      : o_(std::move(options)),
        engine_(engine),
        transfer_(transfer),
        self_(std::move(self)),
        send_(std::move(send)) {}
  using Key = std::pair<OwnerKey, uint64_t>;
  struct Retained {
    Lid target;
    int64_t positions = 0;
    int64_t last_ms = 0;
  };
  // The handoff sender to `target` (made on first use); nullptr when its ring cannot be had.
  MirrorSender* HandoffTo(const Hop& target);
  void ForgetRetained(const OwnerKey& owner, const std::vector<uint64_t>& ids);
  int64_t NowMs() const { return (o_.clock != nullptr ? o_.clock : RealClock::Get())->NowMs(); }

  const KvStandbyOptions o_;
  Engine& engine_;
  transport::TransferEngine& transfer_;
  MirrorSender::Self self_;
  MirrorSender::SendSignal send_;
  std::unique_ptr<MirrorSender> sender_;
  std::unique_ptr<MirrorStore> store_;
  std::map<Lid, std::unique_ptr<MirrorSender>> handoffs_;  // by decode instance
  uint64_t handoff_senders_made_ = 0;
  std::map<Key, Retained> retained_;
  int64_t bytes_per_position_ = 0;  // measured on the first export
  uint64_t retention_expired_ = 0;
  MirrorSenderStats handoffs_gone_;  // of senders dropped (their targets went)
};

}  // namespace connex::pp

#endif  // CONNEX_PP_KV_STANDBY_H_
