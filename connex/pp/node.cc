#include "connex/pp/node.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <thread>
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
#include "connex/pp/internal/recent_set.h"
#include "connex/pp/internal/registration.h"
#include "connex/pp/internal/work_queue.h"
#include "connex/pp/messages.h"
#include "connex/pp/release_queue.h"
#include "connex/pp/request_owner.h"
#include "connex/pp/route_table.h"
#include "connex/pp/send_ring.h"
#include "connex/pp/step_receiver.h"
#include "connex/pp/step_sender.h"

namespace connex::pp {

namespace {

constexpr size_t kGonePeers = 4096;
constexpr int64_t kDrainQuietMs = 100;
constexpr size_t kRetiredTransports = 2;
constexpr int64_t kPruneEveryMs = 1000;

}  // namespace

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
        lid_{o_.model, o_.stage, 0, o_.replica},
        routes_(o_.stages),
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
    owner_ = std::make_unique<RequestOwner>(ro, engine_, static_cast<OwnerHost&>(*this));
    drain_ = std::make_unique<DrainState>(
        lid_.ToString(), reg_.get(),
        [this](const absl::Status& why) { return owner_->FinishAll(why); },
        [this] { return owner_->requests(); });
  }

  ~Impl() { StopLoop(); }

  // On error nothing is left running: ~Impl (StopLoop) undoes what was set up.
  absl::Status Start() {
    CONNEX_RETURN_IF_ERROR(o_.Validate());
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<SendRing> ring,
                            SendRing::Create(*transfer_, static_cast<size_t>(o_.ring_slots),
                                             static_cast<size_t>(o_.slot_bytes)));
    StepSenderOptions so;
    so.self = lid_;
    so.ack_timeout_ms = o_.step_timeout_ms;
    so.clock = clock_;
    so.first_corr = (rng_() << 16) | 1;
    sender_ = std::make_unique<StepSender>(
        so, std::move(ring), [this](const std::string& a, const Signal& sig) { Send(a, sig); },
        [this](const SendFailure& f) {
          HopFailed(f.owner, f.step, f.attempt, f.ticket, f.hop, f.code, f.reason);
        });
    ReleaseQueueOptions ro;
    ro.owner = lid_;
    ro.owner_token = owner_token_;
    // Retried for about 20 s (20 attempts, backing off to at least 1 s): long enough to ride
    // out a directory restart that hides a stage's current address for a while (campaign seed
    // 6 of a loaded run: 10 attempts within 2 s all went to a migrated stage's old address).
    ro.max_attempts = 20;
    ro.max_backoff_ms = std::max<int64_t>(o_.step_timeout_ms, 1000);
    ro.first_nonce = (rng_() << 16) | 1;
    releases_ = std::make_unique<ReleaseQueue>(
        ro, [this](const Lid& stage) { return routes_.SignalOf(stage); },
        [this](const std::string& a, const Signal& sig) { Send(a, sig); });
    StepReceiverOptions recv;
    recv.self = lid_;
    recv.stage = o_.stage;
    recv.stages = o_.stages;
    recv.slot_bytes = o_.slot_bytes;
    recv.replay_cache_bytes = o_.replay_cache_bytes;
    recv.executed = &ledger_;
    recv.admit = [this](uint64_t epoch) { return Admit(epoch); };
    CONNEX_ASSIGN_OR_RETURN(
        receiver_,
        StepReceiver::Create(
            recv, engine_, *transfer_, [reg = reg_] { return reg->epoch.load(); },
            [this](const std::string& a, const Signal& sig) { Send(a, sig); },
            [this](const StepSignal& step, const TensorDict& out) { Deliver(step, out); }));
    signals_->SetReceiver([this](std::string frame) { Post(std::move(frame)); });
    // The client may outlive this node: the callback holds the shared registration state, not
    // the node.
    dir_.OnRegistrationChange([reg = reg_, lid = lid_](const directory::RegistrationChange& c) {
      reg->OnChange(lid, c);
    });
    CONNEX_RETURN_IF_ERROR(dir_.Watch(o_.model));
    // One peer set per stage this node deals with: the one place that knows its live, draining
    // and failed members (directory events, and the transport's peer-death events of the peers
    // it watches).
    CONNEX_RETURN_IF_ERROR(routes_.Watch(dir_, transfer_.get(), lid_,
                                         [this](const elastic::PeerChange& c) { Post(c); }));
    // Our own epoch's FAILED (a fence) and LEFT (an operator's drain, unless we asked for it).
    subscription_ = dir_.Subscribe(
        [reg = reg_, lid = lid_](const directory::Event& e) { reg->OnEvent(lid, e); });
    const int64_t lease = dir_.lease_ttl_ms() > 0 ? dir_.lease_ttl_ms() : o_.probe_timeout_ms;
    const int64_t stall_ms = o_.stall_confirm_ms > 0
                                 ? o_.stall_confirm_ms
                                 : std::max<int64_t>(1, std::min(o_.probe_timeout_ms, lease) / 2);
    guard_ =
        std::make_unique<EpochGuard>(lid_.ToString(), clock_, stall_ms, reg_.get(), &lease_source_);
    CONNEX_ASSIGN_OR_RETURN(uint64_t epoch, dir_.Join(lid_, Addresses(), JoinMetadata()));
    joined_ = true;
    reg_->AdvanceEpoch(epoch);
    loop_ = std::thread([this] { Run(); });
    queue_.LoopStarted();
    return absl::OkStatus();
  }

  absl::Status Submit(uint64_t id, std::vector<int32_t> prompt, int max_new, Completion done,
                      SubmitOptions options) {
    if (o_.stage != 0) {
      return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " is not stage 0"));
    }
    if (prompt.empty()) return absl::InvalidArgumentError(StrCat("request ", id, ": empty prompt"));
    if (max_new <= 0)
      return absl::InvalidArgumentError(StrCat("request ", id, ": max_new_tokens ", max_new));
    if (options.timeout_ms < 0)
      return absl::InvalidArgumentError(
          StrCat("request ", id, ": timeout_ms ", options.timeout_ms));
    if (absl::Status ok = options.sampling.Validate(); !ok.ok())
      return absl::InvalidArgumentError(StrCat("request ", id, ": ", ok.message()));
    CONNEX_RETURN_IF_ERROR(Health());
    return Call([this, id, prompt = std::move(prompt), max_new, done = std::move(done),
                 options = std::move(options)]() mutable -> absl::Status {
      if (drain_->draining()) {  // before the health: a drained node's LID is gone, by design
        return absl::UnavailableError(StrCat("pp: ", lid_.ToString(), " is draining"));
      }
      CONNEX_RETURN_IF_ERROR(Health());
      return owner_->Add(id, std::move(prompt), max_new, std::move(done),
                         std::move(options.on_token), options.sampling, options.timeout_ms);
    });
  }

  absl::Status Cancel(uint64_t id, absl::Status why) {
    if (o_.stage != 0) {
      return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " is not stage 0"));
    }
    if (why.ok()) why = absl::CancelledError("cancelled");
    auto cancel = [this, id, why]() -> absl::Status {
      if (!owner_->Running(id)) {
        return absl::NotFoundError(StrCat("request ", id, " is not running"));
      }
      owner_->Finish(id, why);
      return absl::OkStatus();
    };
    // From a callback of this node (on_token saw a stop string): the loop is ours already.
    if (std::this_thread::get_id() == loop_.get_id()) return cancel();
    return Call(std::move(cancel));
  }

  void CancelLater(uint64_t id, absl::Status why) {
    if (o_.stage != 0) return;
    if (why.ok()) why = absl::CancelledError("cancelled");
    Command cmd;
    cmd.run = [this, id, why] { owner_->Finish(id, why); };  // ignores a request not running
    (void)PostCommand(std::move(cmd));
  }

  void Stop(bool leave, int64_t drain_timeout_ms) {
    if (leave && !IsStopped()) {
      // LEFT first, so that owners stop routing new steps here; then finish what is in flight.
      // The gate: the loop opens `drained` once nothing of ours is in flight.
      auto drained = std::make_shared<std::promise<void>>();
      auto future = drained->get_future();
      Command cmd;
      cmd.run = [this, drained] { drain_->BeginLeave(drained); };
      cmd.cancel = [drained] { drained->set_value(); };
      if (PostCommand(std::move(cmd))) {
        reg_->leaving.store(true);
        if (joined_) (void)dir_.Leave(lid_);
        joined_ = false;
        (void)future.wait_for(std::chrono::milliseconds(drain_timeout_ms));
      }
    }
    StopLoop();
  }

  absl::Status Migrate(std::unique_ptr<SignalTransport> signals) {
    CONNEX_RETURN_IF_ERROR(Health());
    SignalTransport* fresh = signals.get();
    fresh->SetReceiver([this](std::string frame) { Post(std::move(frame)); });
    return Call([this, s = std::shared_ptr<SignalTransport>(std::move(signals))]() mutable {
      std::unique_ptr<SignalTransport> old = std::move(signals_);
      signals_.reset(new ForwardingTransport(std::move(s)));
      absl::StatusOr<uint64_t> epoch = dir_.Join(lid_, Addresses(), JoinMetadata());
      if (epoch.ok()) reg_->AdvanceEpoch(*epoch);
      old->Close();
      retired_.push_back(std::move(old));
      while (retired_.size() > kRetiredTransports) retired_.pop_front();
      return epoch.status();
    });
  }

  const Lid& lid() const { return lid_; }
  uint64_t epoch() const { return reg_->epoch.load(); }
  StageNodeStats Stats() const {
    connex::MutexLock lock(&stats_mu_);
    return stats_snapshot_;
  }
  absl::Status Health() const { return drain_->lost_status(); }

  // The record's metadata: the caller's, and the groups this stage exchanges steps with (the
  // directory takes its failure reports about those only: directory::kPeerGroupsKey). The owner
  // deals with every later stage; a later stage with the owners and the next stage.
  std::map<std::string, std::string> JoinMetadata() const {
    std::map<std::string, std::string> m = o_.metadata;
    std::string groups;
    for (uint32_t g = 0; g < o_.stages; ++g) {
      if (DealsWith(o_.stage, g)) groups += StrCat(groups.empty() ? "" : ",", g);
    }
    m.emplace(std::string(directory::kPeerGroupsKey), groups);
    return m;
  }

  // What health() reports: the registration's state, and Unavailable while draining.
  absl::Status PublicHealth() const { return drain_->health(); }
  void OnDrained(std::function<void()> callback) { drain_->OnDrained(std::move(callback)); }

 private:
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

  Hop Self() const override {
    Hop h;
    h.lid = lid_;
    h.epoch = reg_->epoch.load();
    h.signal = signals_->address();
    h.addresses = transfer_->LocalAddresses();
    return h;
  }

  void Post(Item item) { (void)queue_.Push(std::move(item)); }

  // False when the loop has stopped (the command was not queued).
  bool PostCommand(Command cmd) { return queue_.PushToLoop(std::move(cmd)); }

  // Runs `fn` on the loop and returns its answer; FailedPrecondition when the loop stopped first.
  absl::Status Call(std::function<absl::Status()> fn) {
    auto result = std::make_shared<std::promise<absl::Status>>();
    auto future = result->get_future();
    Command cmd;
    cmd.run = [fn = std::move(fn), result] { result->set_value(fn()); };
    cmd.cancel = [this, result] { result->set_value(StoppedError()); };
    if (!PostCommand(std::move(cmd))) return StoppedError();
    return future.get();
  }
  absl::Status StoppedError() const {
    return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " stopped"));
  }

  bool IsStopped() { return queue_.closed(); }

  void StopLoop() {
    if (!queue_.Close()) return;
    stop_.store(true);
    if (loop_.joinable()) loop_.join();
    for (Item& item : queue_.TakeAll()) {
      if (auto* cmd = std::get_if<Command>(&item)) {
        if (cmd->cancel) cmd->cancel();
      }
    }
    if (subscription_ != 0) dir_.Unsubscribe(subscription_);
    routes_.Clear();  // no peer-set callbacks after this
    signals_->Close();
    owner_->DropAll(absl::CancelledError(StrCat("pp: ", lid_.ToString(), " stopped")));
    drain_->Stopped();
    sender_.reset();
    receiver_.reset();
  }

  void Send(const std::string& address, const Signal& signal) override {
    if (address.empty()) return;
    signals_->Send(address, Encode(signal));
  }

  // ---- the loop ----

  void Run() {
    CONNEX_CHECK(sender_ != nullptr && receiver_ != nullptr && guard_ != nullptr);  // Start's
    while (!stop_.load()) {
      int64_t now = NowMs();
      int64_t wait = std::max<int64_t>(0, std::min<int64_t>(20, NextTimer(now) - now));
      std::deque<Item> items = queue_.Take(absl::Milliseconds(wait));
      guard_->NoteAlive();
      drain_->BeforeTurn();
      for (Item& item : items) {
        guard_->NoteAlive();
        if (stop_.load()) {
          if (auto* cmd = std::get_if<Command>(&item)) {
            if (cmd->cancel) cmd->cancel();
          }
          continue;
        }
        if (auto* frame = std::get_if<std::string>(&item)) {
          HandleFrame(*frame);
        } else if (auto* pc = std::get_if<elastic::PeerChange>(&item)) {
          HandlePeerChange(*pc);
        } else if (auto* cmd = std::get_if<Command>(&item)) {
          cmd->run();
        }
      }
      now = NowMs();
      RunTimers(now);
      sender_->Flush();
      if (o_.stage == 0) {
        if (!drain_->draining() && !drain_->lost()) owner_->Schedule(now);
        releases_->Flush(now, owner_->last_step(), signals_->address());
      }
      if (now - last_prune_ms_ >= kPruneEveryMs) {
        last_prune_ms_ = now;
        Prune();
      }
      // The drain gate opens once nothing of ours is in flight and no step arrived for a short
      // while (owners that had not yet seen our LEFT may still have routed one here).
      const bool idle = owner_->steps() == 0 && sender_->queued() == 0 &&
                        sender_->awaiting_ack() == 0 && now - last_step_ms_ >= kDrainQuietMs;
      drain_->AfterTurn(idle);
      PublishStats();
    }
  }

  // Whether a step (or, on stage 0, its own step) may run under `epoch`, this incarnation's
  // (EpochGuard: evicted, stalled, on the lease).
  absl::Status Admit(uint64_t epoch) { return guard_->Admit(epoch); }

  int64_t NextTimer(int64_t now) const {
    int64_t next = now + 20;
    next = sender_ ? sender_->NextDeadline(next) : next;
    return owner_->NextTimer(next);
  }

  void PublishStats() override {
    stats_.ring_in_use = sender_ ? sender_->slots_in_use() : 0;
    stats_.backpressured = sender_ ? sender_->backpressured() : 0;
    const RequestOwnerStats& owned = owner_->stats();
    stats_.late_dropped = owned.late_dropped;
    stats_.resends = owned.resends;
    stats_.failovers = owned.failovers;
    stats_.reprefills = owned.reprefills;
    stats_.aborted = owned.aborted;
    stats_.completed = owned.completed;
    stats_.chunked = owned.chunked;
    stats_.requests_in_flight = owner_->requests();
    stats_.stalled_ms = owner_->stalled_ms(NowMs());
    stats_.steps_in_flight = owner_->steps() + (sender_ ? sender_->queued() : 0);
    if (receiver_) {
      const StepReceiverStats& r = receiver_->stats();
      stats_.steps_executed = r.steps_executed + owned.steps_executed;
      stats_.steps_replayed = r.steps_replayed;
      stats_.duplicates_dropped = r.duplicates_dropped;
      stats_.fenced = r.fenced;
      stats_.missing_reported = r.missing_reported;
      stats_.released = r.released;
      stats_.forged_dropped = r.forged_dropped + owned.forged_dropped + acks_forged_dropped_;
      stats_.strangers_ignored = strangers_ignored_;
      stats_.held_requests = receiver_->held_requests();
      stats_.replay_bytes = receiver_->replay_bytes();
    }
    stats_.releases_pending = releases_ ? releases_->pending() : 0;
    stats_.epoch = reg_->epoch.load();
    stats_.epoch_checks = guard_->stats().epoch_checks;
    stats_.steps_on_lease = guard_->stats().steps_on_lease;
    ledger_.Hold(stats_.epoch);
    stats_.epochs = ledger_.epochs();
    connex::MutexLock lock(&stats_mu_);
    stats_snapshot_ = stats_;
  }

  // ---- signals ----

  void HandleFrame(const std::string& frame) {
    absl::StatusOr<Signal> signal = Decode(frame);
    if (!signal.ok()) {
      CONNEX_LOG_WARN("pp {}: dropped a malformed signal: {}", lid_.ToString(),
                      AsStd(signal.status().message()));
      return;
    }
    std::visit([this](auto& s) { On(s); }, *signal);
    // After the frame was handled: a step that arrives after a silence is admitted (or not)
    // before it counts as contact (Admit, "on the lease").
    if (routes_.FromMember(*signal, lid_, last_ack_matched_)) guard_->NotePeer();
  }

  // ---- the receiver ----

  void On(StepSignal& s) {
    last_step_ms_ = NowMs();
    receiver_->OnStep(s);
  }

  // Hands a stage's output on: to the next hop, or (last stage) the tokens to the owner.
  void Deliver(const StepSignal& s, const TensorDict& out) {
    if (o_.stage + 1 == o_.stages) {
      absl::StatusOr<Signal> answer = LastStageAnswer(s, out, lid_, reg_->epoch.load());
      if (!answer.ok() || std::holds_alternative<StepErrorSignal>(*answer)) {
        CONNEX_LOG_ERROR("pp {}: the engine's last-stage output lacks {}", lid_.ToString(),
                         kNextTokens);
      }
      if (answer.ok()) Send(s.owner.signal, *answer);
      return;
    }
    absl::StatusOr<PendingSend> next = NextHop(s, out, Self());
    if (!next.ok()) {
      CONNEX_LOG_ERROR("pp {}: {}", lid_.ToString(), AsStd(next.status().message()));
      return;
    }
    sender_->Forward(*std::move(next));
  }

  void On(AckSignal& a) {
    last_ack_matched_ = sender_->OnAck(a);
    if (!last_ack_matched_) ++acks_forged_dropped_;
  }

  // Tells the owner that hop `hop` of its step could not be reached (or handles it, if we are
  // the owner).
  void HopFailed(const Hop& owner, uint64_t step, uint32_t attempt, uint64_t ticket, uint32_t hop,
                 absl::StatusCode code, const std::string& reason) {
    HopFailedSignal f{
        step, attempt, lid_, hop, static_cast<uint32_t>(code), reason, reg_->epoch.load(), ticket};
    if (owner.lid == lid_) {
      CONNEX_CHECK(o_.stage == 0);  // only stage 0 sends steps it owns
      owner_->OnHopFailed(f);
    } else {
      Send(owner.signal, f);
    }
  }

  // Whether `reply_to` is where `from`, a live or draining member this node watches, takes
  // signals. Answers go only there: a frame names any address it likes.
  bool KnownMember(const Lid& from, const std::string& reply_to) const {
    return routes_.IsMemberSignal(from, reply_to);
  }

  void On(ReleaseSignal& r) {
    // An owner's RELEASE that is not believed is re-sent until acknowledged (ReleaseQueue), so
    // one that arrives before this node has seen the owner join is only late, not lost.
    if (!KnownMember(r.from, r.reply_to)) {
      ++strangers_ignored_;
      return;
    }
    receiver_->OnRelease(r);
  }

  void On(ReleasedSignal& r) { (void)releases_->OnReleased(r); }

  void On(PingSignal& p) {
    if (!KnownMember(p.from, p.reply_to)) {
      ++strangers_ignored_;
      return;
    }
    Send(p.reply_to, PongSignal{p.nonce, lid_, reg_->epoch.load()});
  }

  void On(PongSignal& p) { owner_->OnPong(p); }

  // ---- failure signals ----

  // What the peer sets saw: a failed incarnation's work fails over at once; one that LEFT is
  // draining (no new work; the peer set no longer picks it). An owner that failed loses its
  // requests' state here; one that left keeps it for the grace period.
  void HandlePeerChange(const elastic::PeerChange& c) {
    const Lid& lid = c.record.lid;
    const bool owner = lid.group == 0 && o_.stage != 0;
    switch (c.kind) {
      case elastic::PeerChange::Kind::kFailed:
        if (owner) receiver_->OwnerFailed(lid, c.record.epoch);
        PeerGone(lid, c.record.epoch, c.reason.empty() ? "FAILED" : c.reason);
        // Its socket is not needed any more (a restart under the LID has a new address).
        signals_->Forget(HopFromRecord(c.record).signal);
        break;
      case elastic::PeerChange::Kind::kLeft:
        if (owner) receiver_->OwnerLeft(lid, c.record.epoch, NowMs() + o_.owner_grace_ms);
        break;
      case elastic::PeerChange::Kind::kSuspected:
        CONNEX_LOG_INFO("pp {}: {} suspected ({})", lid_.ToString(), lid.ToString(), c.reason);
        break;  // only a suspicion: the step timeout and the probe decide
      case elastic::PeerChange::Kind::kJoined:
        if (owner) receiver_->OwnerJoined(lid, c.record.epoch);
        break;
      case elastic::PeerChange::Kind::kMigrated:
        // A migrated hop keeps its state: steps fenced at the old epoch come back as
        // HOP_FAILED and are re-sent along the refreshed route.
        break;
    }
  }

  // Evicts (lid, epoch) for this sender and every other (the peer set reports it to the
  // directory without blocking); the eviction comes back as a kFailed change.
  void MarkFailed(const Lid& lid, uint64_t epoch) override { routes_.MarkFailed(lid, epoch); }

  // (lid, epoch) failed: slots waiting for its acknowledgement are free, its steps fail over.
  void PeerGone(const Lid& lid, uint64_t epoch, const std::string& why) {
    if (lid == lid_) return;
    if (!gone_peers_.Insert({lid, epoch})) return;
    CONNEX_LOG_INFO("pp {}: {} epoch {} is gone ({})", lid_.ToString(), lid.ToString(), epoch, why);
    // Slots waiting for the dead peer's acknowledgement are free; its steps fail over.
    sender_->PeerGone(lid, why);
    if (o_.stage != 0) return;
    owner_->PeerGone(lid, epoch, why);
  }

  // Drops what owners that LEFT left behind once their grace ran out.
  void Prune() { receiver_->Tick(NowMs()); }

  // ---- the owner's answers (RequestOwner) ----

  void On(ResultSignal& r) { owner_->OnResult(r); }
  void On(MissingSignal& m) { owner_->OnMissing(m); }
  void On(StepErrorSignal& e) { owner_->OnStepError(e); }
  void On(HopFailedSignal& f) { owner_->OnHopFailed(f); }

  void RunTimers(int64_t now) {
    // Unacknowledged slots: give them up (the header check stops a late reader).
    sender_->Expire(now);
    if (o_.stage != 0) return;
    owner_->RunTimers(now);
  }

  // ---- what the owner asks of the node (OwnerHost) ----

  absl::StatusOr<uint64_t> Admit() override {
    const uint64_t epoch = reg_->epoch.load();
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
  std::shared_ptr<Registration> reg_ = std::make_shared<Registration>();
  RouteTable routes_;  // the peer sets of the stages this node deals with, and routes
  bool joined_ = false;

  // Loop-thread state.
  std::mt19937_64 rng_;
  uint64_t owner_token_ = 0;
  std::unique_ptr<StepSender> sender_;  // the ring, queued sends, slots awaiting their ACK
  std::unique_ptr<StepReceiver> receiver_;
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
  uint64_t subscription_ = 0;      // our own epoch's evictions
  // Owner side.
  std::unique_ptr<RequestOwner> owner_;  // stage 0's requests and steps (others: answers only)
  std::unique_ptr<ReleaseQueue> releases_;
  std::unique_ptr<DrainState> drain_;  // draining (own LEAVE, an operator's drain), a lost LID
  StageNodeStats stats_;

  std::thread loop_;
  std::atomic<bool> stop_{false};
  internal::WorkQueue<Item> queue_;  // frames, peer changes and commands for the loop
  mutable connex::Mutex stats_mu_;
  StageNodeStats stats_snapshot_ ABSL_GUARDED_BY(stats_mu_);
};

StageNode::StageNode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StageNode::~StageNode() { impl_->Stop(false, 0); }

absl::StatusOr<std::unique_ptr<StageNode>> StageNode::Start(
    StageNodeOptions options, Engine& engine, transport::TransferEnginePtr transfer,
    std::unique_ptr<SignalTransport> signals, directory::DirectoryClient& directory) {
  CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(options.model));
  CONNEX_RETURN_IF_ERROR(options.Validate());
  if (transfer == nullptr || signals == nullptr) {
    return absl::InvalidArgumentError("pp: a StageNode needs a transfer engine and signals");
  }
  auto impl = std::make_unique<Impl>(std::move(options), engine, std::move(transfer),
                                     std::move(signals), directory);
  CONNEX_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<StageNode>(new StageNode(std::move(impl)));
}

absl::Status StageNode::Submit(uint64_t request_id, std::vector<int32_t> prompt, int max_new_tokens,
                               Completion done, SubmitOptions options) {
  return impl_->Submit(request_id, std::move(prompt), max_new_tokens, std::move(done),
                       std::move(options));
}
absl::Status StageNode::Submit(uint64_t request_id, std::vector<int32_t> prompt, int max_new_tokens,
                               Completion done, TokenCallback on_token) {
  SubmitOptions options;
  options.on_token = std::move(on_token);
  return impl_->Submit(request_id, std::move(prompt), max_new_tokens, std::move(done),
                       std::move(options));
}
absl::Status StageNode::Cancel(uint64_t request_id, absl::Status why) {
  return impl_->Cancel(request_id, std::move(why));
}
void StageNode::CancelLater(uint64_t request_id, absl::Status why) {
  impl_->CancelLater(request_id, std::move(why));
}
void StageNode::Stop(bool leave, int64_t drain_timeout_ms) { impl_->Stop(leave, drain_timeout_ms); }
absl::Status StageNode::Migrate(std::unique_ptr<SignalTransport> signals) {
  return impl_->Migrate(std::move(signals));
}
const Lid& StageNode::lid() const { return impl_->lid(); }
uint64_t StageNode::epoch() const { return impl_->epoch(); }
absl::Status StageNode::health() const { return impl_->PublicHealth(); }
void StageNode::OnDrained(std::function<void()> callback) { impl_->OnDrained(std::move(callback)); }
StageNodeStats StageNode::stats() const { return impl_->Stats(); }

}  // namespace connex::pp
