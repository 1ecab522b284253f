// StageNode::Impl, the coordinator of a pipeline stage (node.h): the loop thread and its queue,
// registration, and the signals dispatched to the rooms (StepReceiver, StepSender, RequestOwner,
// ReleaseQueue, EpochGuard, RouteTable, DrainState). Its methods are defined in node.cc (start,
// commands from other threads, stop, migration) and node_loop.cc (the loop: signals, peer
// changes, timers, what the owner asks of the node). Internal to connex/pp.
#ifndef CONNEX_PP_INTERNAL_NODE_IMPL_H_
#define CONNEX_PP_INTERNAL_NODE_IMPL_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <tuple>
#include <variant>

#include "connex/base/check.h"
#include "connex/base/clock.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/elastic/peer_set.h"
#include "connex/pp/drain_state.h"
#include "connex/pp/epoch_guard.h"
#include "connex/pp/internal/loop_baton.h"
#include "connex/pp/internal/recent_set.h"
#include "connex/pp/internal/registration.h"
#include "connex/pp/internal/work_queue.h"
#include "connex/pp/kv_standby.h"
#include "connex/pp/messages.h"
#include "connex/pp/node.h"
#include "connex/pp/release_queue.h"
#include "connex/pp/request_owner.h"
#include "connex/pp/route_table.h"
#include "connex/pp/send_ring.h"
#include "connex/pp/step_receiver.h"
#include "connex/pp/step_sender.h"

namespace connex::pp {

// The coordinator: the loop thread and its queue, registration, the signals dispatched to the
// rooms (StepReceiver, StepSender, RequestOwner, ReleaseQueue, EpochGuard, RouteTable).
class StageNode::Impl final : private OwnerHost {
 public:
  Impl(StageNodeOptions options, Engine& engine, transport::TransferEnginePtr transfer,
       std::unique_ptr<SignalTransport> signals, directory::DirectoryClient& directory)
      : o_(std::move(options)),
        clock_(o_.clock != nullptr ? o_.clock : RealClock::Get()),
        engine_(engine),
        transfer_(std::move(transfer)),
        signals_(std::move(signals)),
        dir_(directory),
        lid_{o_.model, PdGroup(o_.pd_role, o_.stage), 0, o_.replica},
        routes_(o_.pd_role == PdRole::kNone ? o_.stages : kPdGroups),
        gone_peers_(kGonePeers),
        lease_source_(directory, lid_) {
    std::random_device rd;
    rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
    const uint64_t first_step = ((rng_() & 0xffff) << 40) | 1;
    owner_token_ = rng_() | 1;
    RequestOwnerOptions ro;
    ro.self = lid_;
    ro.stages = o_.stages;
    ro.inflight = o_.inflight;
    ro.step_timeout_ms = o_.step_timeout_ms;
    ro.probe_timeout_ms = o_.probe_timeout_ms;
    ro.reprefill_max = o_.reprefill_max;
    ro.route_wait_ms = o_.route_wait_ms;
    ro.max_batch = o_.max_batch;
    ro.eos_token = o_.eos_token;
    ro.request_timeout_ms = o_.request_timeout_ms;
    ro.attempt_max = o_.attempt_max;
    ro.owner_token = owner_token_;
    ro.first_step = first_step;
    ro.seed = rng_();
    ro.clock = clock_;
    ro.pd = o_.pd_role == PdRole::kFrontend;
    owner_ = std::make_unique<RequestOwner>(ro, engine_, static_cast<OwnerHost&>(*this));
    drain_ = std::make_unique<DrainState>(
        lid_.ToString(), reg_.get(),
        [this](const absl::Status& why) { return owner_->FinishAll(why); },
        [this] { return owner_->requests(); });
  }

  ~Impl() { StopLoop(); }

  // On error nothing is left running: ~Impl (StopLoop) undoes what was set up.
  absl::Status Start();

  absl::Status Submit(uint64_t id, std::vector<int32_t> prompt, int max_new, Completion done,
                      SubmitOptions options);

  absl::Status Cancel(uint64_t id, absl::Status why);

  void CancelLater(uint64_t id, absl::Status why);

  void Stop(bool leave, int64_t drain_timeout_ms);

  absl::Status Migrate(std::unique_ptr<SignalTransport> signals);

  const Lid& lid() const { return lid_; }
  uint64_t epoch() const { return reg_->epoch(); }
  StageNodeStats Stats() const {
    connex::MutexLock lock(&stats_mu_);
    return stats_snapshot_;
  }
  absl::Status Health() const { return drain_->lost_status(); }

  // The record's metadata: the caller's, and the groups this stage exchanges steps with (the
  // directory takes its failure reports about those only: directory::kPeerGroupsKey). The owner
  // deals with every later stage; a later stage with the owners and the next stage.
  std::map<std::string, std::string> JoinMetadata() const;

  // What health() reports: the registration's state, and Unavailable while draining.
  absl::Status PublicHealth() const { return drain_->health(); }
  void OnDrained(std::function<void()> callback) { drain_->OnDrained(std::move(callback)); }
  bool Turning(int64_t within_ms) const {
    return !stop_.load() && NowMs() - last_turn_ms_.load(std::memory_order_relaxed) <= within_ms;
  }

 private:
  static constexpr size_t kGonePeers = 4096;
  static constexpr int64_t kDrainQuietMs = 100;
  static constexpr size_t kRetiredTransports = 2;
  static constexpr int64_t kPruneEveryMs = 1000;

  // Wraps a shared transport (Migrate's lambda can only capture copyable state).
  class ForwardingTransport : public SignalTransport {
   public:
    explicit ForwardingTransport(std::shared_ptr<SignalTransport> t) : t_(std::move(t)) {}
    const std::string& address() const override { return t_->address(); }
    void SetReceiver(Receiver r) override { t_->SetReceiver(std::move(r)); }
    void Send(const std::string& a, std::string f) override { t_->Send(a, std::move(f)); }
    void Forget(const std::string& a) override { t_->Forget(a); }
    void Close() override { t_->Close(); }

   private:
    std::shared_ptr<SignalTransport> t_;
  };

  // Work for the loop from another thread; `cancel` answers the caller if the loop stopped first.
  struct Command {
    std::function<void()> run;
    std::function<void()> cancel;
  };
  using Item = std::variant<std::string, elastic::PeerChange, Command>;

  // This incarnation's registration, shared with the directory client's callback (which may
  // outlive the node).
  using Registration = internal::Registration;

  int64_t NowMs() const { return clock_->NowMs(); }

  std::vector<std::string> Addresses() const {
    std::vector<std::string> a = transfer_->LocalAddresses();
    a.push_back(signals_->address());
    return a;
  }

  Hop Self() const override;

  void Post(Item item) { (void)queue_.Push(std::move(item)); }

  // False when the loop has stopped (the command was not queued).
  bool PostCommand(Command cmd) { return queue_.PushToLoop(std::move(cmd)); }

  // Runs `fn` on the loop and returns its answer; FailedPrecondition when the loop stopped first.
  absl::Status Call(std::function<absl::Status()> fn);
  absl::Status StoppedError() const {
    return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " stopped"));
  }

  bool IsStopped() { return queue_.closed(); }

  void StopLoop();

  void Send(const std::string& address, const Signal& signal) override {
    if (address.empty()) return;
    signals_->Send(address, Encode(signal));
  }

  // ---- the loop ----

  // How a read on the loop hands the rest over when it hung and this thread lost the loop; none
  // on stage 0, which reads nothing and has no follower thread.
  internal::LoopHandoff Handoff() {
    internal::LoopHandoff h;
    if (o_.stage == 0) return h;
    h.blocking = [this](const std::function<void()>& read) { return baton_.Blocking(read); };
    h.post = [this](std::function<void()> run, std::function<void()> cancel) {
      return queue_.Push(Command{std::move(run), std::move(cancel)});
    };
    return h;
  }

  // A loop thread (internal/loop_baton.h): the first leads at once, the other follows.
  void Run(bool first);
  // Runs the loop while this thread leads (until stop, or a read that hung lost it the loop).
  void Lead();

  // Whether a step (or, on stage 0, its own step) may run under `epoch`, this incarnation's
  // (EpochGuard: evicted, stalled, on the lease).
  absl::Status Admit(uint64_t epoch) { return guard_->Admit(epoch); }

  int64_t NextTimer(int64_t now) const {
    int64_t next = now + 20;
    next = sender_ ? sender_->NextDeadline(next) : next;
    next = kv_ ? kv_->NextDeadline(next) : next;
    return owner_->NextTimer(next);
  }

  void PublishStats() override;

  // ---- signals ----

  void HandleFrame(const std::string& frame);

  // ---- the receiver ----

  void On(StepSignal& s) {
    last_step_ms_ = NowMs();
    receiver_->OnStep(s);
  }

  // Hands a stage's output on: to the next hop, or (last stage) the tokens to the owner.
  void Deliver(const StepSignal& s, const TensorDict& out);

  void On(AckSignal& a) {
    last_ack_matched_ = sender_->OnAck(a);
    if (!last_ack_matched_) ++acks_forged_dropped_;
  }

  // Tells the owner that hop `hop` of its step could not be reached (or handles it, if we are
  // the owner).
  void HopFailed(const Hop& owner, uint64_t step, uint32_t attempt, uint64_t ticket, uint32_t hop,
                 absl::StatusCode code, const std::string& reason);

  // Whether `reply_to` is where `from`, a live or draining member this node watches, takes
  // signals. Answers go only there: a frame names any address it likes.
  bool KnownMember(const Lid& from, const std::string& reply_to) const {
    return routes_.IsMemberSignal(from, reply_to);
  }

  void On(ReleaseSignal& r);

  void On(ReleasedSignal& r) { (void)releases_->OnReleased(r); }

  void On(PingSignal& p);

  void On(PongSignal& p) { owner_->OnPong(p); }

  // ---- KV standby (kv_standby.h) ----

  void On(MirrorSignal& m);
  void On(MirroredSignal& m) {
    if (kv_) (void)kv_->OnMirrored(m);
  }
  void On(MirrorDropSignal& d) {
    if (kv_ && routes_.Usable(d.from, d.from_epoch)) kv_->OnDrop(d);
  }
  // Picks the standby again from the live members of our stage (PD: of our pool; a prefill
  // instance has none, it hands its requests to decode instances).
  void ChooseStandby() {
    if (!kv_ || !o_.kv_standby || o_.pd_role == PdRole::kPrefill) return;
    if (elastic::ElasticPeerSet* own = routes_.peers(lid_.group)) kv_->Choose(own->Peers());
  }

  // ---- PD (pd.h) ----

  // A prefill instance's RESULT held back until the decode instance confirms the state
  // (StageNodeOptions::pd_handoff_wait_ms).
  struct HeldResult {
    std::string address;
    Signal answer;
    OwnerKey owner;
    Lid target;
    std::vector<std::pair<uint64_t, int64_t>> needs;  // request -> positions to be confirmed
    int64_t deadline = 0;
    int64_t held_at = 0;
  };
  // Whether the answer to `s` (from a prefill instance) waits for its handoff; if so it is held.
  bool HoldForHandoff(const StepSignal& s, const Signal& answer);
  // Sends the held answers whose handoff is confirmed, gone or past its wait.
  void ReleaseHeldResults(int64_t now);
  // Drops what the prefill instance retained past CONNEX_PD_RETAIN_MS / _BYTES.
  void ExpireRetained(int64_t now);
  std::optional<Hop> PdHop(uint32_t group, const Hop* current,
                           const std::map<Lid, size_t>& load) const override {
    return routes_.PdHop(group, current, load, o_.replica);
  }

  // ---- failure signals ----

  // What the peer sets saw: a failed incarnation's work fails over at once; one that LEFT is
  // draining (no new work; the peer set no longer picks it). An owner that failed loses its
  // requests' state here; one that left keeps it for the grace period.
  void HandlePeerChange(const elastic::PeerChange& c);

  // Evicts (lid, epoch) for this sender and every other (the peer set reports it to the
  // directory without blocking); the eviction comes back as a kFailed change.
  void MarkFailed(const Lid& lid, uint64_t epoch) override { routes_.MarkFailed(lid, epoch); }

  // (lid, epoch) failed: slots waiting for its acknowledgement are free, its steps fail over.
  void PeerGone(const Lid& lid, uint64_t epoch, const std::string& why);

  // Drops what owners that LEFT left behind once their grace ran out; picks the KV standby
  // again (the peer set's first view comes without a change).
  void Prune() {
    receiver_->Tick(NowMs());
    ChooseStandby();
    ExpireRetained(NowMs());
  }

  // ---- the owner's answers (RequestOwner) ----

  void On(ResultSignal& r) { owner_->OnResult(r); }
  void On(MissingSignal& m) { owner_->OnMissing(m); }
  void On(StepErrorSignal& e) { owner_->OnStepError(e); }
  void On(HopFailedSignal& f) { owner_->OnHopFailed(f); }

  void RunTimers(int64_t now);

  // ---- what the owner asks of the node (OwnerHost) ----

  absl::StatusOr<uint64_t> Admit() override {
    const uint64_t epoch = reg_->epoch();
    CONNEX_RETURN_IF_ERROR(Admit(epoch));
    return epoch;
  }
  void Executed(uint64_t epoch, int64_t admitted_ns) override {
    ledger_.Executed(epoch, admitted_ns);
  }
  bool Usable(const Lid& lid, uint64_t epoch) const override { return routes_.Usable(lid, epoch); }
  std::optional<std::vector<Hop>> BuildRoute(const std::vector<Hop>& current) const override {
    return routes_.Build(current);
  }
  std::string RouteProblem() const override { return routes_.Problem(); }
  uint64_t payload_capacity() const override { return sender_->payload_capacity(); }
  void Forward(PendingSend send) override { sender_->Forward(std::move(send)); }
  void Release(uint64_t id, const std::map<Lid, std::string>& visited) override {
    releases_->Add(id, visited);
  }

  // Configuration and collaborators.
  const StageNodeOptions o_;
  Clock* const clock_;
  Engine& engine_;
  transport::TransferEnginePtr transfer_;
  std::unique_ptr<SignalTransport> signals_;
  std::deque<std::unique_ptr<SignalTransport>> retired_;
  directory::DirectoryClient& dir_;
  const Lid lid_;
  // Our LID's lease as the client keeps it, and what this node decided on top of it.
  std::shared_ptr<Registration> reg_ = std::make_shared<Registration>(dir_.Lease(lid_));
  RouteTable routes_;  // the peer sets of the stages this node deals with, and routes
  bool joined_ = false;

  // Loop-thread state.
  std::mt19937_64 rng_;
  uint64_t owner_token_ = 0;
  std::unique_ptr<StepSender> sender_;  // the ring, queued sends, slots awaiting their ACK
  std::unique_ptr<StepReceiver> receiver_;
  // A later stage's KV standby (CONNEX_PP_KV_STANDBY), a PD instance's handoffs, or none.
  std::unique_ptr<KvStandby> kv_;
  std::deque<HeldResult> held_results_;  // PD prefill
  uint64_t handoff_waits_expired_ = 0;
  uint64_t handoff_results_ = 0;
  uint64_t handoff_wait_ms_ = 0;
  int64_t last_prune_ms_ = 0;
  int64_t last_step_ms_ = 0;  // when the last STEP arrived (the drain gate)
  // Sender side.
  internal::RecentSet<std::pair<Lid, uint64_t>> gone_peers_;  // failed over already
  uint64_t acks_forged_dropped_ = 0;                          // ACKs not from the slot's target
  uint64_t strangers_ignored_ = 0;
  EpochLedger ledger_;  // steps executed per epoch (the receiver's and the owner's own)
  // Self-fencing (Admit): whether a step may run under our epoch; created by Start.
  DirectoryLease lease_source_;
  std::unique_ptr<EpochGuard> guard_;
  bool last_ack_matched_ = false;  // the last ACK handled matched a send of ours (FromMember)
  // Owner side.
  std::unique_ptr<RequestOwner> owner_;  // stage 0's requests and steps (others: answers only)
  std::unique_ptr<ReleaseQueue> releases_;
  std::unique_ptr<DrainState> drain_;  // draining (own LEAVE, an operator's drain), a lost LID
  StageNodeStats stats_;

  std::thread loop_;
  std::thread follower_;  // stages > 0: takes the loop over while a step's read hangs
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> last_turn_ms_{0};  // NowMs() at the loop's last turn (Turning)
  internal::WorkQueue<Item> queue_;       // frames, peer changes and commands for the loop
  std::deque<Item> batch_;                // taken from the queue, not handled yet (the loop's)
  // A read that lasts this long moves the loop to the follower: well above a slot's read here
  // (8 MiB in under 10 ms), well below a probe timeout, so the stage keeps answering.
  internal::LoopBaton baton_{std::min<int64_t>(50, std::max<int64_t>(o_.probe_timeout_ms / 4, 1))};
  mutable connex::Mutex stats_mu_;
  StageNodeStats stats_snapshot_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace connex::pp

#endif  // CONNEX_PP_INTERNAL_NODE_IMPL_H_
