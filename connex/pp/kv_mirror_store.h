// MirrorStore: the standby's side of the KV standby (docs/design/step-protocol.md, "KV
// standby"). A primary (a stage of another replica whose standby this node is) announces the
// state it appended with MIRROR; the store pulls it from the primary's registered memory with one
// one-sided read (ReadSlot, as a step is pulled), keeps it apart from this stage's own requests,
// bounded in bytes (past the budget the oldest mirrors go), and answers MIRRORED with the
// positions it holds. When the owner's re-sent step of such a request comes here, TakeOver
// imports the mirror into the engine. Mirrors go when the primary drops the request, the owner
// is gone, or the primary failed and no step came for them within the grace period.
// Thread-compatible: owned by a StageNode's loop thread.
#ifndef CONNEX_PP_KV_MIRROR_STORE_H_
#define CONNEX_PP_KV_MIRROR_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/pp/engine.h"
#include "connex/pp/internal/read_buffers.h"
#include "connex/pp/internal/recent_set.h"
#include "connex/pp/messages.h"
#include "connex/pp/request_scope.h"
#include "connex/pp/tensor_dict.h"
#include "connex/transport/transfer_engine.h"

namespace connex::pp {

struct MirrorStoreOptions {
  Lid self;
  int64_t slot_bytes = 8 << 20;               // the largest MIRROR payload (header included)
  int64_t budget_bytes = int64_t{256} << 20;  // CONNEX_PP_KV_STANDBY_BYTES
  int64_t orphan_grace_ms = 10000;            // mirrors of a failed primary kept this long
  // A MIRROR's read may outlast the caller's hold on the loop (LoopBaton): the rest (applying
  // and answering it) then goes to the loop. Unset: a read blocks the caller.
  internal::LoopHandoff handoff;
};

struct MirrorStoreStats {
  uint64_t updates = 0;             // MIRRORs applied
  uint64_t bytes_received = 0;      // payload bytes pulled
  uint64_t read_ns = 0;             // time in those one-sided reads (ReadSlot: both header reads)
  uint64_t refused = 0;             // MIRRORs refused (epoch, read, malformed)
  uint64_t gaps = 0;                // updates that did not start where the mirror ends
  uint64_t dropped_for_budget = 0;  // mirrors dropped, oldest first, past the budget
  uint64_t dropped = 0;             // mirrors dropped otherwise (released, owner or primary gone)
  uint64_t takeovers = 0;           // requests imported that ran at once
  uint64_t takeovers_lagged = 0;    // requests imported short of the step (the owner recomputes)
  size_t mirrors = 0;               // held now
  int64_t bytes = 0;                // held now
};

class MirrorStore {
 public:
  using SendSignal = std::function<void(const std::string& address, const Signal& signal)>;

  // Allocates its receive buffers from `transfer` (which must outlive it).
  static absl::StatusOr<std::unique_ptr<MirrorStore>> Create(MirrorStoreOptions options,
                                                             transport::TransferEngine& transfer,
                                                             SendSignal send);
  ~MirrorStore();
  MirrorStore(const MirrorStore&) = delete;
  MirrorStore& operator=(const MirrorStore&) = delete;

  // A MIRROR for this node at `epoch` (this incarnation's, 0: none), at `now_ms`: pulled,
  // applied, answered.
  void OnMirror(const MirrorSignal& m, uint64_t epoch, int64_t now_ms);
  void OnDrop(const MirrorDropSignal& d);
  // The owner released these requests (its RELEASE reached this stage).
  void Released(const OwnerKey& owner, const std::vector<uint64_t>& ids);

  // Positions of the owner's request `id` mirrored here (0: none).
  int64_t Held(const OwnerKey& owner, uint64_t id) const;
  // Imports the first min(Held, upto) positions of the mirror into `engine` as request `local`
  // (which the engine must not hold) and forgets the mirror; the positions imported (0 when
  // there is no mirror or the import failed: the request is then recomputed).
  int64_t TakeOver(const OwnerKey& owner, uint64_t id, uint64_t local, int64_t upto,
                   Engine& engine);

  // The owner incarnations of `lid` up to `epoch` are gone: their mirrors go.
  void OwnerGone(const Lid& lid, uint64_t epoch);
  // The primary (lid, epoch) failed: its mirrors stay for the owners' re-sent steps until
  // `now_ms` + the grace period.
  void PrimaryGone(const Lid& lid, uint64_t epoch, int64_t now_ms);
  void Tick(int64_t now_ms);

  const MirrorStoreStats& stats() const { return stats_; }

 private:
  struct Chunk {
    int64_t from = 0;
    int64_t rows = 0;
    TensorDict state;
    uint64_t bytes = 0;
  };
  struct Mirror {
    Lid primary;
    uint64_t primary_epoch = 0;
    uint64_t owner_epoch = 0;
    int64_t positions = 0;
    std::vector<Chunk> chunks;
    uint64_t bytes = 0;
    uint64_t seq = 0;        // creation order: the budget drops the oldest first
    int64_t drop_at_ms = 0;  // > 0: the primary failed; dropped then
    int64_t updated_ms = 0;  // the last update
  };
  using Key = std::pair<OwnerKey, uint64_t>;

  MirrorStore(MirrorStoreOptions options, transport::TransferEngine& transfer, SendSignal send);
  // Applies request `id`'s rows [from, from + rows) to its mirror; the positions held after it.
  int64_t Apply(const MirrorSignal& m, size_t i, TensorDict state, int64_t now_ms);
  void Erase(std::map<Key, Mirror>::iterator it);
  void Drop(std::map<Key, Mirror>::iterator it);  // counted as dropped
  void Refuse(const MirrorSignal& m, absl::StatusCode code, const std::string& why);
  void KeepBudget();
  // Appends `rows` rows of `state` to `chunk` when both hold the same tensors (names, dtypes,
  // row shapes); false (nothing changed) otherwise.
  static bool AppendRows(Chunk& chunk, const TensorDict& state, int64_t rows);

  const MirrorStoreOptions o_;
  transport::TransferEngine& transfer_;
  SendSignal send_;
  // The rest of OnMirror once its payload was read (`slot`: header and payload).
  void OnMirrorRead(const MirrorSignal& m, const absl::Status& read, const uint8_t* slot,
                    int64_t now_ms);
  internal::ReadBuffers buffers_;  // one per read in progress
  std::map<Key, Mirror> mirrors_;
  // Dropped for the budget: later updates are answered -1 (the primary stops sending them).
  internal::RecentSet<Key> refused_{16384};
  uint64_t next_seq_ = 1;
  MirrorStoreStats stats_;
};

// The rows [begin, end) of every tensor of `dict` (each has one row per position).
TensorDict SliceRows(const TensorDict& dict, int64_t begin, int64_t end);

}  // namespace connex::pp

#endif  // CONNEX_PP_KV_MIRROR_STORE_H_
