// StepReceiver: the receiving side of the step protocol on a stage — fencing (a step for
// another epoch, or of an owner incarnation that is gone, is refused), duplicate correlation
// ids, the one-sided read of the payload (ReadSlot; one that hangs may move the loop to another
// thread: internal/loop_baton.h), the requests' identities here
// (RequestScope: owner LID and token, a local engine id, the last step run), the replay cache
// that answers a re-sent attempt without running the step again, the engine call, and the
// release of state (RELEASE from the owner, or the owner FAILED / LEFT). The output goes on
// through `deliver` (the node hands it to the next hop or returns the tokens to the owner).
// Thread-compatible: owned by a StageNode's loop thread.
#ifndef CONNEX_PP_STEP_RECEIVER_H_
#define CONNEX_PP_STEP_RECEIVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/pp/engine.h"
#include "connex/pp/epoch_ledger.h"
#include "connex/pp/internal/read_buffers.h"
#include "connex/pp/internal/recent_set.h"
#include "connex/pp/messages.h"
#include "connex/pp/replay_cache.h"
#include "connex/pp/request_scope.h"
#include "connex/transport/transfer_engine.h"

namespace connex::pp {

// The last stage's answer to the owner about step `step`, which produced `output` here (`self`
// under `epoch`): RESULT with the sampled tokens, or, when the engine's output lacks
// kNextTokens, STEP_ERROR (Internal) for the requests of its batch. InvalidArgument when the
// output has no valid batch either (nothing can be said to the owner).
absl::StatusOr<Signal> LastStageAnswer(const StepSignal& step, const TensorDict& output,
                                       const Lid& self, uint64_t epoch);

// What a receiver asks of the stage's KV standby and tells it (kv_standby.h).
class StandbyHooks {
 public:
  virtual ~StandbyHooks() = default;
  // Imports the first positions (at most `upto`) of the mirror of the owner's request `id` into
  // the engine as request `local`; how many (0: there is none, the request is recomputed).
  virtual int64_t TakeOver(const OwnerKey& owner, uint64_t id, uint64_t local, int64_t upto) = 0;
  // These requests of the step's owner ran here from `starts`; their state now covers
  // [0, positions).
  virtual void Ran(const StepSignal& step, const std::vector<uint64_t>& owner_ids,
                   const std::vector<uint64_t>& local_ids, const std::vector<int64_t>& starts,
                   const std::vector<int64_t>& positions) = 0;
  // The owner released these requests here.
  virtual void Released(const OwnerKey& owner, const std::vector<uint64_t>& ids) = 0;
  // The owner incarnations of `lid` up to `epoch` are gone.
  virtual void OwnerGone(const Lid& lid, uint64_t epoch) = 0;
};

struct StepReceiverOptions {
  Lid self;
  uint32_t stage = 0;
  uint32_t stages = 1;
  int64_t slot_bytes = 8 << 20;  // the largest payload (header included) it reads
  int64_t replay_cache_bytes = int64_t{64} << 20;
  EpochLedger* executed = nullptr;  // not owned; records each step executed (nullptr: none)
  // Asked for each step whose target epoch is this incarnation's, before anything else: a
  // refusal (its code and message go back in the ACK, as for a wrong epoch, so that the owner
  // re-routes the step) fences a process that may have been replaced. nullptr: admit all.
  std::function<absl::Status(uint64_t epoch)> admit;
  // The stage's KV standby (not owned; nullptr: none): requests it mirrors are taken over
  // instead of reported missing, and it hears what ran and what was released.
  StandbyHooks* standby = nullptr;
  // A payload read may outlast the caller's hold on the loop (LoopBaton): the rest of the step
  // (OnRead) then goes to the loop. Unset: a read blocks the caller, which goes on with the step.
  internal::LoopHandoff handoff;
};

struct StepReceiverStats {
  uint64_t steps_executed = 0;
  uint64_t steps_replayed = 0;
  uint64_t duplicates_dropped = 0;
  uint64_t fenced = 0;
  uint64_t missing_reported = 0;
  uint64_t released = 0;
  uint64_t forged_dropped = 0;
  uint64_t rewound = 0;  // requests cut back to a step's start (a standby's lag recomputed)
};

class StepReceiver {
 public:
  using Epoch = std::function<uint64_t()>;  // this incarnation's epoch now (0: none)
  using SendSignal = std::function<void(const std::string& address, const Signal& signal)>;
  using Deliver = std::function<void(const StepSignal& step, const TensorDict& output)>;

  // Allocates its receive buffers from `transfer`. `engine` and `transfer` must outlive it.
  static absl::StatusOr<std::unique_ptr<StepReceiver>> Create(StepReceiverOptions options,
                                                              Engine& engine,
                                                              transport::TransferEngine& transfer,
                                                              Epoch epoch, SendSignal send,
                                                              Deliver deliver);
  ~StepReceiver();
  StepReceiver(const StepReceiver&) = delete;
  StepReceiver& operator=(const StepReceiver&) = delete;

  // A STEP signal for this stage: acknowledged (or refused, with the reason), then run, replayed,
  // or reported (MISSING, STEP_ERROR) to its owner.
  void OnStep(const StepSignal& step);
  // The owner is done with these requests (believed only with its token); answers RELEASED.
  void OnRelease(const ReleaseSignal& release);
  // Drops the owner's request `id` here without a RELEASE (a prefill instance's retention ran
  // out): a later step of it finds no state (MISSING). False when it was not held.
  bool Evict(const OwnerKey& owner, uint64_t id);
  // The owner incarnation (lid, epoch) FAILED: its requests' state goes now, its late steps are
  // refused. LEFT: it drains and releases what it finishes; what is left goes after `grace_ms`.
  void OwnerFailed(const Lid& lid, uint64_t epoch) { DropOwner(lid, epoch, "FAILED"); }
  // The owner LID JOINED under `epoch`: a new process holds it, so every incarnation before it is
  // gone, whether or not its FAILED reached this stage (a catch-up after a directory restart
  // reports only the epoch it had seen; campaign seed 33).
  void OwnerJoined(const Lid& lid, uint64_t epoch) {
    if (epoch > 1) DropOwner(lid, epoch - 1, "superseded by a JOIN");
  }
  void OwnerLeft(const Lid& lid, uint64_t epoch, int64_t drop_at_ms);
  // Drops the state of owners that left once their grace ran out.
  void Tick(int64_t now_ms);

  const StepReceiverStats& stats() const { return stats_; }
  size_t held_requests() const { return scope_.requests(); }
  // Steps whose payload is being read, or was read by a thread that no longer runs the loop.
  size_t reading() const { return reading_.size(); }
  uint64_t replay_bytes() const { return replay_.bytes(); }

 private:
  StepReceiver(StepReceiverOptions options, Engine& engine, transport::TransferEngine& transfer,
               Epoch epoch, SendSignal send, Deliver deliver);
  void DropOwner(const Lid& lid, uint64_t epoch, std::string_view why);
  // Why step `s` is refused here (its ACK), or nullopt. Without `admit`, the options' admit hook
  // is not asked (before the read).
  std::optional<AckSignal> Refusal(const StepSignal& s, bool admit);
  // The step's payload was read (`read`: ReadSlot's answer; `slot`: header and payload);
  // `repeats` duplicates of its signal arrived meanwhile (each gets the ACK too).
  void OnRead(const StepSignal& s, const absl::Status& read, const uint8_t* slot, int repeats);
  void Acknowledge(const StepSignal& s, const AckSignal& ack, int repeats);

  const StepReceiverOptions o_;
  Engine& engine_;
  transport::TransferEngine& transfer_;
  Epoch epoch_;
  SendSignal send_;
  Deliver deliver_;
  internal::ReadBuffers buffers_;    // one per read in progress
  std::map<uint64_t, int> reading_;  // corr of the steps being read -> duplicates meanwhile
  internal::RecentSet<uint64_t> seen_corr_;
  // Owner LID -> the highest epoch of it that FAILED or LEFT here: no step of that or an
  // earlier incarnation runs again (it would make state nobody releases).
  internal::RecentMap<Lid, uint64_t> gone_owners_;
  // Released requests, as (owner token, request id) -> the last step id the release covers. The
  // token alone names the owner incarnation here (64 random bits), which keeps an entry small.
  internal::RecentMap<std::pair<uint64_t, uint64_t>, uint64_t> released_;
  std::map<std::pair<Lid, uint64_t>, int64_t> owners_leaving_;  // -> when their state goes
  RequestScope scope_;
  ReplayCache replay_;
  StepReceiverStats stats_;
};

}  // namespace connex::pp

#endif  // CONNEX_PP_STEP_RECEIVER_H_
