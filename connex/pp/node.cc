#include "connex/pp/node.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <variant>

#include "absl/strings/match.h"
#include "connex/base/clock.h"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/elastic/peer_set.h"
#include "connex/pp/epoch_guard.h"
#include "connex/pp/internal/batch_select.h"
#include "connex/pp/internal/recent_set.h"
#include "connex/pp/internal/registration.h"
#include "connex/pp/messages.h"
#include "connex/pp/release_queue.h"
#include "connex/pp/route_table.h"
#include "connex/pp/scheduler.h"
#include "connex/pp/send_ring.h"
#include "connex/pp/step_receiver.h"
#include "connex/pp/step_sender.h"

namespace connex::pp {

absl::StatusOr<StageNodeOptions> StageNodeOptions::FromEnv(StageNodeOptions o) {
  CONNEX_ASSIGN_OR_RETURN(int64_t inflight, EnvInt("CONNEX_PP_INFLIGHT", o.inflight, 1, 1024));
  o.inflight = static_cast<int>(inflight);
  CONNEX_ASSIGN_OR_RETURN(o.step_timeout_ms,
                          EnvInt("CONNEX_PP_STEP_TIMEOUT_MS", o.step_timeout_ms, 1, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.probe_timeout_ms,
                          EnvInt("CONNEX_PP_PROBE_TIMEOUT_MS", o.probe_timeout_ms, 1, 600'000));
  CONNEX_ASSIGN_OR_RETURN(int64_t max, EnvInt("CONNEX_PP_REPREFILL_MAX", o.reprefill_max, 0, 1000));
  o.reprefill_max = static_cast<int>(max);
  CONNEX_ASSIGN_OR_RETURN(o.route_wait_ms,
                          EnvInt("CONNEX_PP_ROUTE_WAIT_MS", o.route_wait_ms, 1, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(int64_t slots, EnvInt("CONNEX_PP_RING_SLOTS", o.ring_slots, 1, 4096));
  o.ring_slots = static_cast<int>(slots);
  CONNEX_ASSIGN_OR_RETURN(o.slot_bytes,
                          EnvInt("CONNEX_PP_SLOT_BYTES", o.slot_bytes, 4096, int64_t{1} << 32));
  CONNEX_ASSIGN_OR_RETURN(int64_t batch, EnvInt("CONNEX_PP_MAX_BATCH", o.max_batch, 1, 4096));
  o.max_batch = static_cast<int>(batch);
  CONNEX_ASSIGN_OR_RETURN(o.request_timeout_ms, EnvInt("CONNEX_PP_REQUEST_TIMEOUT_MS",
                                                       o.request_timeout_ms, 0, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(int64_t attempts,
                          EnvInt("CONNEX_PP_ATTEMPT_MAX", o.attempt_max, 1, 100000));
  o.attempt_max = static_cast<int>(attempts);
  CONNEX_ASSIGN_OR_RETURN(o.replay_cache_bytes, EnvInt("CONNEX_PP_REPLAY_CACHE_BYTES",
                                                       o.replay_cache_bytes, 0, int64_t{1} << 40));
  CONNEX_ASSIGN_OR_RETURN(o.owner_grace_ms,
                          EnvInt("CONNEX_PP_OWNER_GRACE_MS", o.owner_grace_ms, 0, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(o.stall_confirm_ms,
                          EnvInt("CONNEX_PP_STALL_CONFIRM_MS", o.stall_confirm_ms, 0, 3'600'000));
  return o;
}

absl::Status StageNodeOptions::Validate() const {
  if (stages == 0) return absl::InvalidArgumentError("pp: stages must be at least 1, not 0");
  if (stage >= stages) {
    return absl::InvalidArgumentError(StrCat("pp: stage ", stage, " is outside a pipeline of ",
                                             stages, " stages (0..", stages - 1, ")"));
  }
  if (inflight < 1) return absl::InvalidArgumentError(StrCat("pp: inflight ", inflight));
  if (ring_slots < 1) return absl::InvalidArgumentError(StrCat("pp: ring_slots ", ring_slots));
  if (slot_bytes < 4096 || slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(
        StrCat("pp: slot_bytes ", slot_bytes, " (need a multiple of 64, at least 4096)"));
  }
  if (max_batch < 1) return absl::InvalidArgumentError(StrCat("pp: max_batch ", max_batch));
  if (attempt_max < 1) return absl::InvalidArgumentError(StrCat("pp: attempt_max ", attempt_max));
  if (step_timeout_ms < 1 || probe_timeout_ms < 1 || route_wait_ms < 1 || request_timeout_ms < 0 ||
      stall_confirm_ms < 0) {
    return absl::InvalidArgumentError("pp: timeouts must be positive");
  }
  return absl::OkStatus();
}

namespace {

constexpr size_t kGonePeers = 4096;
constexpr int64_t kDrainQuietMs = 100;
constexpr size_t kRetiredTransports = 2;
constexpr int64_t kPruneEveryMs = 1000;
// Bytes a step's payload needs besides its per-token rows: the batch keys and alignment.
constexpr uint64_t kStepOverheadBytes = 4096;

// Errors of a hop that no re-send can cure: the step itself does not fit or is malformed.
bool Permanent(absl::StatusCode code) {
  return code == absl::StatusCode::kInvalidArgument ||
         code == absl::StatusCode::kResourceExhausted || code == absl::StatusCode::kOutOfRange;
}

// The lease of `lid` as this node's directory client holds it, for its EpochGuard.
class DirectoryLease final : public LeaseSource {
 public:
  DirectoryLease(directory::DirectoryClient& directory, Lid lid)
      : dir_(directory), lid_(std::move(lid)) {}
  std::optional<int64_t> RenewalAgeMs() const override { return dir_.RenewalAgeMs(lid_); }
  std::optional<int64_t> LeaseLeftMs() const override { return dir_.LeaseLeftMs(lid_); }
  int64_t heartbeat_ms() const override { return dir_.heartbeat_ms(); }
  absl::StatusOr<uint64_t> Renew() override { return dir_.Renew(lid_); }

 private:
  directory::DirectoryClient& dir_;
  const Lid lid_;
};

}  // namespace

class StageNode::Impl {
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
    next_step_ = ((rng_() & 0xffff) << 40) | 1;
    owner_token_ = rng_() | 1;
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
      if (c.lid != lid) return;
      if (c.status.ok()) {
        reg->AdvanceEpoch(c.new_epoch);
      } else if (c.new_epoch == 0) {
        if (c.left) reg->ended_by_leave.store(true);
        connex::MutexLock lock(&reg->mu);
        reg->lost = Annotate(
            c.status, StrCat("pp: ", lid.ToString(), " lost its LID (epoch ", c.old_epoch, ")"));
      }
    });
    CONNEX_RETURN_IF_ERROR(dir_.Watch(o_.model));
    // One peer set per stage this node deals with: the one place that knows its live, draining
    // and failed members (directory events, and the transport's peer-death events of the peers
    // it watches). The owner routes through stages 1..N-1 and watches them all. A later stage
    // watches the next one (it forwards there: a dead target frees its slots at once) and follows
    // the owners through the directory alone (an owner's death drops its requests' state; that
    // is not on the critical path, and watching every owner's transport would cost connections
    // and heartbeats on every stage).
    for (uint32_t g = 0; g < o_.stages; ++g) {
      const bool needed = o_.stage == 0 ? g != 0 : (g == 0 || g == o_.stage + 1);
      if (!needed) continue;
      transport::TransferEngine* watch = (o_.stage != 0 && g == 0) ? nullptr : transfer_.get();
      elastic::ElasticPeerSetOptions po;
      po.model = o_.model;
      po.group = g;
      po.own_replica = o_.replica;
      po.reporter = lid_.ToString();
      po.shard = 0;
      po.member_address_prefix = std::string(kSignalScheme);
      auto set = std::make_unique<elastic::ElasticPeerSet>(dir_, watch, po);
      set->OnChange([this](const elastic::PeerChange& c) { Post(c); });
      CONNEX_RETURN_IF_ERROR(set->Start());
      routes_.Set(g, std::move(set));
    }
    // A FAILED of our own epoch (a sender's report, a lease run out) fences it at once: its
    // steps are refused while the directory client joins again (its heartbeat is due at that
    // event). A LEFT that is not our own LEAVE is an operator's drain (only the holder or the
    // admin token can end an epoch gracefully): no fence, the node drains — no new work, what is
    // in flight finishes, an owner's unfinished requests end as Unavailable (a proxy resumes
    // them elsewhere) — and then says so (OnDrained).
    subscription_ = dir_.Subscribe([reg = reg_, lid = lid_](const directory::Event& e) {
      if (e.record.lid != lid) return;
      if (e.kind == directory::EventKind::kFailed) {
        reg->Revoke(e.record.epoch,
                    StrCat(directory::EventKindName(e.kind), e.reason.empty() ? "" : " (", e.reason,
                           e.reason.empty() ? "" : ")"));
      } else if (e.kind == directory::EventKind::kLeft && !reg->leaving.load() &&
                 e.record.epoch == reg->epoch.load()) {
        reg->operator_drain.store(true);
      }
    });
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
    auto accepted = std::make_shared<std::promise<absl::Status>>();
    auto future = accepted->get_future();
    Command cmd;
    cmd.run = [this, id, prompt = std::move(prompt), max_new, done = std::move(done),
               options = std::move(options), accepted]() mutable {
      if (draining_) {  // before the health: a drained node's LID is gone, by design
        accepted->set_value(
            absl::UnavailableError(StrCat("pp: ", lid_.ToString(), " is draining")));
        return;
      }
      absl::Status health = Health();
      if (!health.ok()) {
        accepted->set_value(health);
        return;
      }
      if (requests_.count(id)) {
        accepted->set_value(
            absl::InvalidArgumentError(StrCat("request ", id, " is already running")));
        return;
      }
      Request r;
      r.tokens = std::move(prompt);
      r.prompt_len = r.tokens.size();
      r.max_new = max_new;
      r.done = std::move(done);
      r.on_token = std::move(options.on_token);
      r.sampling = options.sampling;
      r.waiting_since = NowMs();
      int64_t timeout = options.timeout_ms > 0 ? options.timeout_ms : o_.request_timeout_ms;
      r.timeout_ms = timeout;
      r.deadline = timeout > 0 ? NowMs() + timeout : 0;
      if (requests_.empty()) last_progress_ms_ = NowMs();  // the stall clock starts with work
      requests_.emplace(id, std::move(r));
      accepted->set_value(absl::OkStatus());
    };
    cmd.cancel = [this, accepted] {
      accepted->set_value(
          absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " stopped")));
    };
    if (!PostCommand(std::move(cmd))) {
      return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " stopped"));
    }
    return future.get();
  }

  absl::Status Cancel(uint64_t id, absl::Status why) {
    if (o_.stage != 0) {
      return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " is not stage 0"));
    }
    if (why.ok()) why = absl::CancelledError("cancelled");
    if (std::this_thread::get_id() == loop_.get_id()) {
      // From a callback of this node (on_token saw a stop string): the loop is ours already.
      if (!requests_.count(id))
        return absl::NotFoundError(StrCat("request ", id, " is not running"));
      Finish(id, why);
      return absl::OkStatus();
    }
    auto result = std::make_shared<std::promise<absl::Status>>();
    auto future = result->get_future();
    Command cmd;
    cmd.run = [this, id, why, result] {
      if (!requests_.count(id)) {
        result->set_value(absl::NotFoundError(StrCat("request ", id, " is not running")));
        return;
      }
      Finish(id, why);
      result->set_value(absl::OkStatus());
    };
    cmd.cancel = [this, result] {
      result->set_value(absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " stopped")));
    };
    if (!PostCommand(std::move(cmd))) {
      return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " stopped"));
    }
    return future.get();
  }

  void CancelLater(uint64_t id, absl::Status why) {
    if (o_.stage != 0) return;
    if (why.ok()) why = absl::CancelledError("cancelled");
    Command cmd;
    cmd.run = [this, id, why] { Finish(id, why); };  // Finish ignores a request not running
    (void)PostCommand(std::move(cmd));
  }

  void Stop(bool leave, int64_t drain_timeout_ms) {
    if (leave && !IsStopped()) {
      // LEFT first, so that owners stop routing new steps here; then finish what is in flight.
      // The gate: the loop opens `drained` once nothing of ours is in flight.
      auto drained = std::make_shared<std::promise<void>>();
      auto future = drained->get_future();
      Command cmd;
      cmd.run = [this, drained] {
        draining_ = true;
        draining_flag_.store(true);
        drained_ = drained;
      };
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
    auto done = std::make_shared<std::promise<absl::Status>>();
    auto future = done->get_future();
    SignalTransport* fresh = signals.get();
    fresh->SetReceiver([this](std::string frame) { Post(std::move(frame)); });
    Command cmd;
    cmd.run = [this, s = std::shared_ptr<SignalTransport>(std::move(signals)), done]() mutable {
      std::unique_ptr<SignalTransport> old = std::move(signals_);
      signals_.reset(new ForwardingTransport(std::move(s)));
      absl::StatusOr<uint64_t> epoch = dir_.Join(lid_, Addresses(), JoinMetadata());
      if (epoch.ok()) reg_->AdvanceEpoch(*epoch);
      old->Close();
      retired_.push_back(std::move(old));
      while (retired_.size() > kRetiredTransports) retired_.pop_front();
      done->set_value(epoch.status());
    };
    cmd.cancel = [this, done] {
      done->set_value(absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " stopped")));
    };
    if (!PostCommand(std::move(cmd))) {
      return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " stopped"));
    }
    return future.get();
  }

  const Lid& lid() const { return lid_; }
  uint64_t epoch() const { return reg_->epoch.load(); }
  StageNodeStats Stats() const {
    connex::MutexLock lock(&stats_mu_);
    return stats_snapshot_;
  }
  absl::Status Health() const {
    connex::MutexLock lock(&reg_->mu);
    return reg_->lost;
  }

  // The record's metadata: the caller's, and the groups this stage exchanges steps with (the
  // directory takes its failure reports about those only: directory::kPeerGroupsKey). The owner
  // deals with every later stage; a later stage with the owners and the next stage.
  std::map<std::string, std::string> JoinMetadata() const {
    std::map<std::string, std::string> m = o_.metadata;
    std::string groups;
    for (uint32_t g = 0; g < o_.stages; ++g) {
      const bool peer = o_.stage == 0 ? g != 0 : (g == 0 || g == o_.stage + 1);
      if (peer) groups += StrCat(groups.empty() ? "" : ",", g);
    }
    m.emplace(std::string(directory::kPeerGroupsKey), groups);
    return m;
  }

  // What health() reports: the registration's state, and Unavailable while draining.
  absl::Status PublicHealth() const {
    if (draining_flag_.load()) {
      return absl::UnavailableError(StrCat("pp: ", lid_.ToString(), " is draining"));
    }
    return Health();
  }

  void OnDrained(std::function<void()> callback) {
    connex::MutexLock lock(&drained_mu_);
    on_drained_ = std::move(callback);
  }

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

  struct Request {
    std::vector<int32_t> tokens;  // prompt, then generated
    size_t prompt_len = 0;
    int max_new = 0;
    size_t cached = 0;   // positions the route holds
    size_t sent_to = 0;  // the in-flight step covers tokens [cached, sent_to)
    std::vector<Hop> route;
    // Stages that may hold its state, released at the end, with the signal address last seen.
    std::map<Lid, std::string> visited;
    uint64_t step = 0;  // in flight; 0 none
    int reprefills = 0;
    int64_t waiting_since = 0;  // for a route
    int64_t deadline = 0;       // 0: none
    int64_t timeout_ms = 0;
    Completion done;
    StageNode::TokenCallback on_token;
    Sampling sampling;
  };
  struct Step {
    uint32_t attempt = 1;
    uint64_t ticket = 0;  // of the current attempt
    std::vector<uint64_t> ids;
    std::set<uint64_t> remaining;
    std::vector<int32_t> starts, counts;
    std::vector<Hop> route;
    TensorDict output;  // stage 0's, kept to re-send
    int64_t deadline = 0;
    int64_t probe_until = 0;  // probing when > 0
    std::set<Lid> ponged;
    std::vector<uint64_t> pings;  // nonces of the probe in progress
    int64_t resend_at = 0;        // a re-send waits for a slot, a route or a backoff when > 0
    std::string last_problem;     // why it was last re-sent
    bool sent = false;
  };
  int64_t NowMs() const { return clock_->NowMs(); }

  std::vector<std::string> Addresses() const {
    std::vector<std::string> a = transfer_->LocalAddresses();
    a.push_back(signals_->address());
    return a;
  }

  Hop Self() const {
    Hop h;
    h.lid = lid_;
    h.epoch = reg_->epoch.load();
    h.signal = signals_->address();
    h.addresses = transfer_->LocalAddresses();
    return h;
  }

  void Post(Item item) {
    connex::MutexLock lock(&queue_mu_);
    if (stopped_) return;
    queue_.push_back(std::move(item));
  }

  // False when the loop has stopped (the command was not queued).
  bool PostCommand(Command cmd) {
    connex::MutexLock lock(&queue_mu_);
    if (stopped_ || !loop_.joinable()) return false;
    queue_.push_back(std::move(cmd));
    return true;
  }

  bool IsStopped() {
    connex::MutexLock lock(&queue_mu_);
    return stopped_;
  }

  void StopLoop() {
    std::deque<Item> left;
    {
      connex::MutexLock lock(&queue_mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    stop_.store(true);
    if (loop_.joinable()) loop_.join();
    {
      connex::MutexLock lock(&queue_mu_);
      left.swap(queue_);
    }
    for (Item& item : left) {
      if (auto* cmd = std::get_if<Command>(&item)) {
        if (cmd->cancel) cmd->cancel();
      }
    }
    if (subscription_ != 0) dir_.Unsubscribe(subscription_);
    routes_.Clear();  // no peer-set callbacks after this
    signals_->Close();
    for (auto& [id, r] : requests_) {
      if (r.done) r.done(id, absl::CancelledError(StrCat("pp: ", lid_.ToString(), " stopped")));
    }
    requests_.clear();
    if (drained_) {
      drained_->set_value();
      drained_.reset();
    }
    sender_.reset();
    receiver_.reset();
  }

  void Send(const std::string& address, const Signal& signal) {
    if (address.empty()) return;
    signals_->Send(address, Encode(signal));
  }

  // ---- the loop ----

  void Run() {
    while (!stop_.load()) {
      int64_t now = NowMs();
      int64_t wait = std::max<int64_t>(0, std::min<int64_t>(20, NextTimer(now) - now));
      std::deque<Item> items;
      {
        connex::MutexLock lock(&queue_mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return !queue_.empty(); };
        queue_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(wait));
        items.swap(queue_);
      }
      guard_->NoteAlive();
      CheckRegistration();
      if (reg_->operator_drain.load() && !operator_draining_) StartOperatorDrain();
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
        Schedule(now);
        releases_->Flush(now, next_step_ - 1, signals_->address());
      }
      if (now - last_prune_ms_ >= kPruneEveryMs) {
        last_prune_ms_ = now;
        Prune();
      }
      // The drain gate opens once nothing of ours is in flight and no step arrived for a short
      // while (owners that had not yet seen our LEFT may still have routed one here).
      const bool idle = steps_.empty() && sender_->queued() == 0 && sender_->awaiting_ack() == 0 &&
                        now - last_step_ms_ >= kDrainQuietMs;
      if (drained_ && idle) {
        drained_->set_value();
        drained_.reset();
      }
      if (operator_draining_ && !operator_drained_ && idle) FinishOperatorDrain();
      PublishStats();
    }
  }

  // An operator's drain (connexctl drain: a LEFT of our epoch we did not ask for): no new work
  // from now on; what is in flight finishes (FinishOperatorDrain).
  void StartOperatorDrain() {
    operator_draining_ = true;
    draining_ = true;
    draining_flag_.store(true);
    CONNEX_LOG_WARN(
        "pp {}: drained by the operator: no new work; finishing the steps in flight "
        "({} requests owned here)",
        lid_.ToString(), requests_.size());
  }

  // Nothing of ours is in flight any more: an owner's requests that did not end hand over (a
  // server-side Unavailable, which connex-proxy resumes on another replica); then OnDrained.
  void FinishOperatorDrain() {
    operator_drained_ = true;
    std::vector<uint64_t> ids;
    for (const auto& [id, q] : requests_) ids.push_back(id);
    for (uint64_t id : ids) {
      Finish(id, absl::UnavailableError(StrCat("pp: ", lid_.ToString(),
                                               " was drained by the operator before the request "
                                               "ended; it continues on another replica")));
    }
    CONNEX_LOG_WARN("pp {}: drained ({} requests handed over)", lid_.ToString(), ids.size());
    std::function<void()> on_drained;
    {
      connex::MutexLock lock(&drained_mu_);
      on_drained = on_drained_;
    }
    if (on_drained) on_drained();
  }

  // A node that lost its LID refuses everything from then on, and says so once, loudly. After an
  // operator's drain that is expected (the heartbeat finds the epoch gone, possibly before the
  // LEFT event came): the drain goes on.
  void CheckRegistration() {
    if (lost_) return;
    absl::Status health = Health();
    if (health.ok()) return;
    if (reg_->operator_drain.load() || reg_->ended_by_leave.load()) {
      reg_->operator_drain.store(true);
      return;
    }
    lost_ = true;
    CONNEX_LOG_ERROR("pp {}: {}; this node no longer serves", lid_.ToString(),
                     AsStd(health.message()));
    reg_->Fence();  // every step for any epoch is fenced from now on
    std::vector<uint64_t> ids;
    for (const auto& [id, q] : requests_) ids.push_back(id);
    for (uint64_t id : ids) Finish(id, health);
  }

  // Whether a step (or, on stage 0, its own step) may run under `epoch`, this incarnation's
  // (EpochGuard: evicted, stalled, on the lease).
  absl::Status Admit(uint64_t epoch) { return guard_->Admit(epoch); }

  int64_t NextTimer(int64_t now) const {
    int64_t next = now + 20;
    next = sender_ ? sender_->NextDeadline(next) : next;
    for (const auto& [id, st] : steps_) {
      next = std::min(next, st.probe_until > 0 ? st.probe_until : st.deadline);
      if (st.resend_at > 0) next = std::min(next, st.resend_at);
    }
    return next;
  }

  void PublishStats() {
    stats_.ring_in_use = sender_ ? sender_->slots_in_use() : 0;
    stats_.backpressured = sender_ ? sender_->backpressured() : 0;
    stats_.requests_in_flight = requests_.size();
    stats_.stalled_ms = requests_.empty() ? 0 : NowMs() - last_progress_ms_;
    stats_.steps_in_flight = steps_.size() + (sender_ ? sender_->queued() : 0);
    if (receiver_) {
      const StepReceiverStats& r = receiver_->stats();
      stats_.steps_executed = r.steps_executed + owner_steps_executed_;
      stats_.steps_replayed = r.steps_replayed;
      stats_.duplicates_dropped = r.duplicates_dropped;
      stats_.fenced = r.fenced;
      stats_.missing_reported = r.missing_reported;
      stats_.released = r.released;
      stats_.forged_dropped = r.forged_dropped + owner_forged_dropped_;
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
    if (FromMember(*signal)) guard_->NotePeer();
  }

  // Whether `signal` came from a live member this node deals with: contact with the peers that
  // would report this stage if they could not reach it. Signals without an epoch (ACK, PING,
  // RELEASE) count when their sender is a known member at the address it names or (ACK) the
  // ACK matched a send of ours.
  bool FromMember(const Signal& signal) const {
    if (const auto* s = std::get_if<StepSignal>(&signal)) {
      return routes_.Usable(s->owner.lid, s->owner.epoch) || s->owner.lid == lid_;
    }
    if (const auto* r = std::get_if<ResultSignal>(&signal))
      return routes_.Usable(r->from, r->from_epoch);
    if (const auto* m = std::get_if<MissingSignal>(&signal))
      return routes_.Usable(m->from, m->from_epoch);
    if (const auto* f = std::get_if<HopFailedSignal>(&signal))
      return routes_.Usable(f->from, f->from_epoch);
    if (const auto* e = std::get_if<StepErrorSignal>(&signal))
      return routes_.Usable(e->from, e->from_epoch);
    if (const auto* p = std::get_if<PongSignal>(&signal)) return routes_.Usable(p->from, p->epoch);
    if (const auto* p = std::get_if<PingSignal>(&signal)) return KnownMember(p->from, p->reply_to);
    if (const auto* r = std::get_if<ReleaseSignal>(&signal))
      return KnownMember(r->from, r->reply_to);
    if (std::holds_alternative<AckSignal>(signal)) return last_ack_matched_;
    return false;
  }

  // ---- the receiver ----

  void On(StepSignal& s) {
    last_step_ms_ = NowMs();
    receiver_->OnStep(s);
  }

  // Hands a stage's output on: to the next hop, or (last stage) the tokens to the owner.
  void Deliver(const StepSignal& s, const TensorDict& out) {
    if (o_.stage + 1 == o_.stages) {
      absl::StatusOr<Batch> b = GetBatch(out);
      absl::StatusOr<const Tensor*> next = out.Get(kNextTokens, DType::kI32, 1);
      if (!b.ok() || !next.ok()) {
        CONNEX_LOG_ERROR("pp {}: the engine's last-stage output lacks {}", lid_.ToString(),
                         kNextTokens);
        if (b.ok()) {
          Send(s.owner.signal,
               StepErrorSignal{s.step, s.attempt, lid_, b->request_ids,
                               static_cast<uint32_t>(absl::StatusCode::kInternal),
                               StrCat(lid_.ToString(), ": the engine returned no ", kNextTokens),
                               reg_->epoch.load(), s.ticket});
        }
        return;
      }
      auto tokens = (*next)->values<int32_t>();
      ResultSignal r{s.step,
                     s.attempt,
                     lid_,
                     b->request_ids,
                     std::vector<int32_t>(tokens.begin(), tokens.end()),
                     reg_->epoch.load(),
                     s.ticket};
      Send(s.owner.signal, r);
      return;
    }
    if (s.hop + 1 >= s.route.size()) {
      CONNEX_LOG_ERROR("pp {}: step {} has no hop after {}", lid_.ToString(), s.step, s.hop);
      return;
    }
    absl::StatusOr<Batch> b = GetBatch(out);
    if (!b.ok()) {
      CONNEX_LOG_ERROR("pp {}: the engine's output of step {} has no valid batch: {}",
                       lid_.ToString(), s.step, AsStd(b.status().message()));
      return;
    }
    PendingSend p;
    p.signal = s;
    p.signal.hop = s.hop + 1;
    p.signal.origin = Self();
    // The requests that ran (or were replayed) here, not those reported missing.
    p.signal.request_ids = b->request_ids;
    p.signal.start_positions = b->start_positions;
    p.signal.num_tokens = b->num_tokens;
    p.payload = out;
    sender_->Forward(std::move(p));
  }

  void On(AckSignal& a) {
    last_ack_matched_ = sender_->OnAck(a);
    if (!last_ack_matched_) ++owner_forged_dropped_;
  }

  // Tells the owner that hop `hop` of its step could not be reached (or handles it, if we are
  // the owner).
  void HopFailed(const Hop& owner, uint64_t step, uint32_t attempt, uint64_t ticket, uint32_t hop,
                 absl::StatusCode code, const std::string& reason) {
    HopFailedSignal f{
        step, attempt, lid_, hop, static_cast<uint32_t>(code), reason, reg_->epoch.load(), ticket};
    if (owner.lid == lid_) {
      On(f);
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

  void On(PongSignal& p) {
    auto it = pings_.find(p.nonce);
    if (it == pings_.end()) return;
    auto [step_id, expected] = it->second;
    pings_.erase(it);
    if (expected != p.from) {
      ++owner_forged_dropped_;
      return;
    }
    auto st = steps_.find(step_id);
    if (st != steps_.end()) st->second.ponged.insert(p.from);
  }

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
  void MarkFailed(const Lid& lid, uint64_t epoch) { routes_.MarkFailed(lid, epoch); }

  // (lid, epoch) failed: slots waiting for its acknowledgement are free, its steps fail over.
  void PeerGone(const Lid& lid, uint64_t epoch, const std::string& why) {
    if (lid == lid_) return;
    if (!gone_peers_.Insert({lid, epoch})) return;
    CONNEX_LOG_INFO("pp {}: {} epoch {} is gone ({})", lid_.ToString(), lid.ToString(), epoch, why);
    // Slots waiting for the dead peer's acknowledgement are free; its steps fail over.
    sender_->PeerGone(lid, why);
    if (o_.stage != 0) return;
    std::vector<uint64_t> affected;
    for (const auto& [id, st] : steps_) {
      for (const Hop& h : st.route) {
        if (h.lid == lid && h.epoch == epoch) {
          affected.push_back(id);
          break;
        }
      }
    }
    for (uint64_t id : affected) Resend(id, why);
  }

  // Drops what owners that LEFT left behind once their grace ran out.
  void Prune() { receiver_->Tick(NowMs()); }

  // ---- the owner ----

  // Whether an answer about step `st` really comes from the hop it claims: the LID and epoch
  // of a hop of the step's current route (the last one for a RESULT), and the attempt's ticket.
  bool Believe(const Step& st, const Lid& from, uint64_t from_epoch, uint64_t ticket,
               bool last_only) {
    if (ticket != st.ticket) return false;
    if (st.route.empty()) return from == lid_;
    if (last_only) return st.route.back().lid == from && st.route.back().epoch == from_epoch;
    for (const Hop& h : st.route) {
      if (h.lid == from && h.epoch == from_epoch) return true;
    }
    return from == lid_;
  }

  void On(ResultSignal& r) {
    auto it = steps_.find(r.step);
    if (it == steps_.end() || it->second.attempt != r.attempt) {
      ++stats_.late_dropped;
      return;
    }
    Step& st = it->second;
    if (!Believe(st, r.from, r.from_epoch, r.ticket, /*last_only=*/true)) {
      ++owner_forged_dropped_;
      CONNEX_LOG_WARN(
          "pp {}: dropped a RESULT of step {} from {} epoch {}: not the step's last hop",
          lid_.ToString(), r.step, r.from.ToString(), r.from_epoch);
      return;
    }
    last_progress_ms_ = NowMs();
    for (size_t i = 0; i < r.request_ids.size(); ++i) {
      uint64_t id = r.request_ids[i];
      if (!st.remaining.erase(id)) continue;
      auto req = requests_.find(id);
      if (req == requests_.end()) continue;
      Request& q = req->second;
      q.step = 0;
      if (q.sent_to < q.tokens.size()) {
        // A chunk of a longer prefill: the token sampled after it is not wanted.
        q.cached = q.sent_to;
        continue;
      }
      CONNEX_LOG_TRACE("pp {}: step {} attempt {}: request {} token {} from {}", lid_.ToString(),
                       r.step, r.attempt, id, r.tokens[i], r.from.ToString());
      q.cached = q.tokens.size();
      q.tokens.push_back(r.tokens[i]);
      const size_t generated = q.tokens.size() - q.prompt_len;
      const bool last = static_cast<int>(generated) >= q.max_new || r.tokens[i] == o_.eos_token;
      if (q.on_token) q.on_token(id, r.tokens[i]);  // may Cancel the request: `q` is gone then
      if (last && requests_.count(id)) Finish(id, absl::OkStatus());
    }
    EraseStepIfDone(r.step);
  }

  void On(MissingSignal& m) {
    auto it = steps_.find(m.step);
    if (it == steps_.end() || it->second.attempt != m.attempt) {
      ++stats_.late_dropped;
      return;
    }
    Step& st = it->second;
    if (!Believe(st, m.from, m.from_epoch, m.ticket, /*last_only=*/false)) {
      ++owner_forged_dropped_;
      return;
    }
    for (uint64_t id : m.request_ids) {
      if (!st.remaining.erase(id)) continue;
      auto req = requests_.find(id);
      if (req == requests_.end()) continue;
      Request& q = req->second;
      q.step = 0;
      q.cached = 0;  // re-prefill prompt + generated along the route
      ++q.reprefills;
      ++stats_.reprefills;
      if (q.reprefills > o_.reprefill_max) {
        Finish(id, absl::AbortedError(
                       StrCat("request ", id, ": aborted after ", q.reprefills - 1,
                              " failovers (CONNEX_PP_REPREFILL_MAX=", o_.reprefill_max,
                              "); last: ", m.from.ToString(), " did not hold its state")));
      }
    }
    EraseStepIfDone(m.step);
  }

  void On(StepErrorSignal& e) {
    auto it = steps_.find(e.step);
    if (it == steps_.end() || it->second.attempt != e.attempt) {
      ++stats_.late_dropped;
      return;
    }
    if (!Believe(it->second, e.from, e.from_epoch, e.ticket, /*last_only=*/false)) {
      ++owner_forged_dropped_;
      return;
    }
    absl::StatusCode code = static_cast<absl::StatusCode>(e.code);
    if (code == absl::StatusCode::kOk) code = absl::StatusCode::kInternal;
    std::vector<uint64_t> ids;
    for (uint64_t id : e.request_ids) {
      if (it->second.remaining.count(id)) ids.push_back(id);
    }
    for (uint64_t id : ids) {  // Finish may erase the step
      Finish(id, absl::Status(code, StrCat("request ", id, ": stage ", e.from.group,
                                           " failed the step: ", e.message)));
    }
  }

  void On(HopFailedSignal& f) {
    auto it = steps_.find(f.step);
    if (it == steps_.end() || it->second.attempt != f.attempt) return;
    Step& st = it->second;
    if (!Believe(st, f.from, f.from_epoch, f.ticket, /*last_only=*/false)) {
      ++owner_forged_dropped_;
      return;
    }
    if (Permanent(static_cast<absl::StatusCode>(f.code))) {
      // No re-send can cure it (the step does not fit, or is refused as malformed).
      std::vector<uint64_t> ids(st.remaining.begin(), st.remaining.end());
      for (uint64_t id : ids) {
        Finish(id, absl::Status(static_cast<absl::StatusCode>(f.code),
                                StrCat("request ", id, ": step to stage ", f.hop + 1,
                                       " cannot be delivered: ", f.reason)));
      }
      return;
    }
    if (st.resend_at > 0) return;
    st.last_problem = f.reason;
    // Back off a little so that a peer whose death is not known yet does not spin the step.
    st.resend_at = NowMs() + std::min<int64_t>(200, 5 << std::min<uint32_t>(st.attempt, 5));
    CONNEX_LOG_DEBUG("pp {}: step {} attempt {}: hop {} failed: {}", lid_.ToString(), f.step,
                     f.attempt, f.hop, f.reason);
  }

  void EraseStepIfDone(uint64_t step_id) {
    auto it = steps_.find(step_id);
    if (it == steps_.end() || !it->second.remaining.empty()) return;
    for (uint64_t nonce : it->second.pings) pings_.erase(nonce);
    steps_.erase(it);
  }

  void Finish(uint64_t id, absl::Status status) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    Request q = std::move(it->second);
    requests_.erase(it);
    if (q.step != 0) {
      auto st = steps_.find(q.step);
      if (st != steps_.end()) {
        st->second.remaining.erase(id);
        EraseStepIfDone(q.step);
      }
    }
    engine_.Release(id);
    releases_->Add(id, q.visited);
    // What led to this outcome (re-prefills, failovers, ...) is in stats() before the caller
    // hears of it: a caller that reads stats() after its request ended sees them.
    if (status.ok()) {
      ++stats_.completed;
      PublishStats();
      if (q.done) q.done(id, std::vector<int32_t>(q.tokens.begin() + q.prompt_len, q.tokens.end()));
    } else {
      ++stats_.aborted;
      if (status.code() == absl::StatusCode::kCancelled) {
        CONNEX_LOG_INFO("pp {}: request {} cancelled: {}", lid_.ToString(), id,
                        AsStd(status.message()));
      } else {
        CONNEX_LOG_WARN("pp {}: {}", lid_.ToString(), AsStd(status.message()));
      }
      PublishStats();
      if (q.done) q.done(id, status);
    }
  }

  void Resend(uint64_t step_id, const std::string& why) {
    auto it = steps_.find(step_id);
    if (it == steps_.end()) return;
    Step& st = it->second;
    ++st.attempt;
    st.ticket = rng_() | 1;
    ++stats_.resends;
    st.probe_until = 0;
    st.ponged.clear();
    for (uint64_t nonce : st.pings) pings_.erase(nonce);
    st.pings.clear();
    st.resend_at = 0;
    st.last_problem = why;
    if (st.attempt > static_cast<uint32_t>(o_.attempt_max)) {
      std::vector<uint64_t> ids(st.remaining.begin(), st.remaining.end());
      for (uint64_t id : ids) {
        Finish(id, absl::UnavailableError(StrCat("request ", id, ": step sent ", st.attempt - 1,
                                                 " times without a result (CONNEX_PP_ATTEMPT_MAX=",
                                                 o_.attempt_max, "); last: ", why)));
      }
      return;
    }
    std::optional<std::vector<Hop>> route = routes_.Build(st.route);
    if (!route) {
      st.resend_at = NowMs() + 50;  // wait for a replica to appear
      st.deadline = NowMs() + o_.step_timeout_ms;
      --st.attempt;  // waiting for a route is not a send
      CheckRouteWait(st);
      return;
    }
    bool moved = false;
    for (size_t i = 0; i < route->size(); ++i) moved |= (*route)[i].lid != st.route[i].lid;
    if (moved) {
      stats_.failovers += st.remaining.size();
      CONNEX_LOG_INFO("pp {}: step {} attempt {} re-routed ({})", lid_.ToString(), step_id,
                      st.attempt, why);
    }
    st.route = *route;
    for (uint64_t id : st.remaining) {
      auto req = requests_.find(id);
      if (req == requests_.end()) continue;
      req->second.route = *route;
      for (const Hop& h : *route) req->second.visited[h.lid] = h.signal;
    }
    SendStep(step_id, st);
  }

  void CheckRouteWait(Step& st) {
    for (uint64_t id : std::vector<uint64_t>(st.remaining.begin(), st.remaining.end())) {
      auto req = requests_.find(id);
      if (req == requests_.end()) continue;
      if (NowMs() - req->second.waiting_since > o_.route_wait_ms) {
        Finish(id,
               absl::UnavailableError(StrCat("request ", id, ": no live replica of some stage for ",
                                             o_.route_wait_ms, " ms (", routes_.Problem(), ")")));
      }
    }
  }

  void SendStep(uint64_t step_id, Step& st) {
    PendingSend p;
    StepSignal& s = p.signal;
    s.step = step_id;
    s.attempt = st.attempt;
    s.ticket = st.ticket;
    s.owner_token = owner_token_;
    s.owner = Self();
    s.origin = Self();
    s.hop = 0;
    s.route = st.route;
    // Only the requests the owner still waits for: the others were answered or moved to a
    // re-prefill, and must not be run again.
    std::vector<bool> keep;
    for (size_t i = 0; i < st.ids.size(); ++i) {
      keep.push_back(st.remaining.count(st.ids[i]) > 0);
      if (!keep.back()) continue;
      s.request_ids.push_back(st.ids[i]);
      s.start_positions.push_back(st.starts[i]);
      s.num_tokens.push_back(st.counts[i]);
    }
    Batch batch{st.ids, st.starts, st.counts};
    p.payload = s.request_ids.size() == st.ids.size() ? st.output
                                                      : internal::Select(st.output, batch, keep);
    st.deadline = NowMs() + o_.step_timeout_ms;
    st.sent = true;
    sender_->Forward(std::move(p));
  }

  void RunTimers(int64_t now) {
    // Unacknowledged slots: give them up (the header check stops a late reader).
    sender_->Expire(now);
    if (o_.stage != 0) return;
    // Requests past their deadline end, whatever they wait for.
    std::vector<uint64_t> late;
    for (const auto& [id, q] : requests_) {
      if (q.deadline > 0 && q.deadline <= now) late.push_back(id);
    }
    for (uint64_t id : late) {
      const Request& q = requests_[id];
      std::string where = "waiting to be scheduled";
      if (q.step != 0) {
        auto st = steps_.find(q.step);
        if (st != steps_.end()) {
          where =
              StrCat("step ", q.step, " attempt ", st->second.attempt,
                     st->second.last_problem.empty() ? "" : ", last: ", st->second.last_problem);
        }
      }
      Finish(id, absl::DeadlineExceededError(StrCat("request ", id, ": not finished within ",
                                                    q.timeout_ms, " ms (", where, ")")));
    }
    std::vector<std::pair<uint64_t, std::string>> resend;
    // Hops that did not answer a finished probe, and the probed steps. They are acted on after
    // this loop: PeerGone re-sends (re-routes) steps, which rewrites the very routes this loop
    // walks — acting inside it reported (and declared dead) hops of the *new* route instead
    // of the silent one (campaign seed 198).
    std::set<std::pair<Lid, uint64_t>> silent;
    std::vector<uint64_t> probed;
    for (auto& [id, st] : steps_) {
      if (st.resend_at > 0 && st.resend_at <= now) {
        resend.emplace_back(id, st.last_problem.empty() ? "hop failed" : st.last_problem);
        continue;
      }
      if (st.probe_until > 0) {
        if (st.probe_until > now) continue;
        // The probe is over: a hop that did not answer is dead.
        for (const Hop& h : st.route) {
          if (!st.ponged.count(h.lid)) silent.emplace(h.lid, h.epoch);
        }
        for (uint64_t nonce : st.pings) pings_.erase(nonce);
        st.pings.clear();
        probed.push_back(id);
        continue;
      }
      if (st.deadline <= now) {
        st.probe_until = now + o_.probe_timeout_ms;
        st.ponged.clear();
        for (const Hop& h : st.route) {
          uint64_t nonce = rng_() | 1;
          pings_[nonce] = {id, h.lid};
          st.pings.push_back(nonce);
          Send(h.signal, PingSignal{nonce, lid_, signals_->address()});
        }
      }
    }
    for (const auto& [lid, epoch] : silent) {
      CONNEX_LOG_INFO("pp {}: {} epoch {} did not answer a probe after a step timeout",
                      lid_.ToString(), lid.ToString(), epoch);
      MarkFailed(lid, epoch);
    }
    for (uint64_t id : probed) {
      // Not re-sent by PeerGone already (every hop answered: the step itself was lost).
      auto it = steps_.find(id);
      if (it != steps_.end() && it->second.probe_until > 0) resend.emplace_back(id, "step timeout");
    }
    for (auto& [id, why] : resend) Resend(id, why);
  }

  // ---- scheduling (owner) ----

  // Tokens one step may carry so that stage 0's output fits a ring slot (see MaxStepTokens).
  uint64_t MaxStepTokens() const {
    return pp::MaxStepTokens(engine_.OutputBytesPerToken(), measured_bytes_per_token_,
                             sender_->payload_capacity(), kStepOverheadBytes, o_.stages);
  }

  void Schedule(int64_t now) {
    if (draining_ || lost_) return;
    if (requests_.empty()) return;
    // The owner's own engine step runs under its epoch too: not after an eviction it missed.
    if (absl::Status admitted = Admit(reg_->epoch.load()); !admitted.ok()) {
      CONNEX_LOG_DEBUG("pp {}: no step scheduled: {}", lid_.ToString(), AsStd(admitted.message()));
      return;
    }
    // Requests ready for their next step, grouped by route.
    std::map<std::string, std::vector<uint64_t>> ready;
    std::map<std::string, std::vector<Hop>> routes;
    std::vector<std::pair<uint64_t, absl::Status>> unroutable;
    for (auto& [id, q] : requests_) {
      if (q.step != 0) continue;
      bool valid = q.route.size() == o_.stages - 1;
      for (const Hop& h : q.route) valid &= routes_.Usable(h.lid, h.epoch);
      if (!valid || o_.stages == 1) {
        std::optional<std::vector<Hop>> route = routes_.Build(q.route);
        if (route && q.route.size() == route->size()) {
          bool moved = false;
          for (size_t i = 0; i < route->size(); ++i) moved |= (*route)[i].lid != q.route[i].lid;
          if (moved) ++stats_.failovers;  // its next step goes to another replica
        }
        if (!route) {
          if (now - q.waiting_since > o_.route_wait_ms) {
            unroutable.emplace_back(id, absl::UnavailableError(StrCat(
                                            "request ", id, ": no live replica of some stage for ",
                                            o_.route_wait_ms, " ms (", routes_.Problem(), ")")));
          }
          continue;
        }
        q.route = *route;
      } else {
        // Keep the hops, refresh their epochs and addresses (a migration keeps the state).
        std::optional<std::vector<Hop>> fresh = routes_.Build(q.route);
        if (fresh) q.route = *fresh;
      }
      for (const Hop& h : q.route) q.visited[h.lid] = h.signal;
      std::string key = RouteKey(q.route);
      ready[key].push_back(id);
      routes[key] = q.route;
    }
    for (auto& [id, status] : unroutable) Finish(id, status);
    if (ready.empty()) return;
    std::map<std::string, int> inflight;
    for (const auto& [id, st] : steps_) ++inflight[RouteKey(st.route)];
    StepLimits limits;
    limits.max_batch = static_cast<size_t>(o_.max_batch);
    limits.max_tokens = MaxStepTokens();
    for (auto& [key, ids] : ready) {
      if (inflight[key] >= o_.inflight) continue;
      limits.max_steps = static_cast<size_t>(o_.inflight - inflight[key]);
      std::vector<ReadyRequest> waiting;
      for (uint64_t id : ids) {
        const Request& q = requests_[id];
        waiting.push_back(ReadyRequest{id, q.cached, q.tokens.size()});
      }
      for (PlannedStep& step : PlanSteps(waiting, limits)) {
        stats_.chunked += step.chunked;
        CreateStep(step.ids, step.ends, routes[key]);
      }
    }
  }

  // Runs stage 0 of a step for `ids` (request i covers tokens [cached, ends[i])) and sends it.
  bool CreateStep(const std::vector<uint64_t>& ids, const std::vector<uint64_t>& ends,
                  const std::vector<Hop>& route) {
    std::vector<int32_t> starts, counts, tokens;
    for (size_t i = 0; i < ids.size(); ++i) {
      Request& q = requests_[ids[i]];
      starts.push_back(static_cast<int32_t>(q.cached));
      counts.push_back(static_cast<int32_t>(ends[i] - q.cached));
      tokens.insert(tokens.end(), q.tokens.begin() + q.cached, q.tokens.begin() + ends[i]);
    }
    TensorDict in;
    SetBatch(in, ids, starts, counts);
    in.Set(kTokens, Tensor::Of<int32_t>({static_cast<int64_t>(tokens.size())}, tokens));
    // The sampling keys, when any request of the step samples (greedy steps carry none).
    std::vector<Sampling> sampling;
    bool sampled = false;
    for (uint64_t id : ids) {
      sampling.push_back(requests_[id].sampling);
      sampled |= !sampling.back().greedy();
    }
    if (sampled) SetSampling(in, sampling);
    std::vector<uint64_t> missing = engine_.MissingRequests(in);
    if (!missing.empty()) {
      // This stage lost them (released): recompute from the prompt on the next round.
      for (uint64_t id : missing) requests_[id].cached = 0;
      return false;
    }
    // Admitted right before it runs (Schedule's admission may be a freeze ago), the time taken
    // first: a freeze after it is a stall that Admit sees.
    const int64_t admitted_ns = MonotonicNowNs();
    const uint64_t epoch = reg_->epoch.load();
    if (absl::Status admitted = Admit(epoch); !admitted.ok()) {
      CONNEX_LOG_DEBUG("pp {}: step not run: {}", lid_.ToString(), AsStd(admitted.message()));
      return false;  // its requests wait for the next round
    }
    absl::StatusOr<TensorDict> out = engine_.ExecuteStep(in);
    if (!out.ok()) {
      for (uint64_t id : ids) {
        Finish(id, Annotate(out.status(), StrCat("request ", id, ": stage 0")));
      }
      return false;
    }
    ++owner_steps_executed_;
    ledger_.Executed(epoch, admitted_ns);
    uint64_t step_id = next_step_++;
    if (o_.stages == 1) {
      absl::StatusOr<const Tensor*> next = out->Get(kNextTokens, DType::kI32, 1);
      if (!next.ok()) {
        for (uint64_t id : ids) Finish(id, next.status());
        return false;
      }
      auto t = (*next)->values<int32_t>();
      Step st;
      st.ids = ids;
      st.remaining = std::set<uint64_t>(ids.begin(), ids.end());
      st.ticket = rng_() | 1;
      for (size_t i = 0; i < ids.size(); ++i) {
        requests_[ids[i]].step = step_id;
        requests_[ids[i]].sent_to = ends[i];
      }
      uint64_t ticket = st.ticket;
      steps_[step_id] = std::move(st);
      ResultSignal r{
          step_id, 1, lid_, ids, std::vector<int32_t>(t.begin(), t.end()), reg_->epoch.load(),
          ticket};
      On(r);
      return true;
    }
    uint64_t size = PackedSize(*out);
    if (!tokens.empty()) {
      // Per token: the rows of the tensors that have one per token (the batch keys and other
      // per-request tensors are the fixed part a chunk's budget already leaves room for).
      const int64_t n = static_cast<int64_t>(tokens.size());
      uint64_t per_token = 0;
      for (const auto& [name, t] : out->tensors()) {
        if (name == kRequestIds || name == kStartPositions || name == kNumTokens) continue;
        if (!t.shape.empty() && t.shape[0] == n) per_token += t.data.size() / tokens.size();
      }
      measured_bytes_per_token_ = std::max(measured_bytes_per_token_, per_token);
    }
    if (size > sender_->payload_capacity()) {
      // The engine gives no per-token figure and this step's output does not fit: recompute
      // these requests in chunks the measurement now bounds.
      CONNEX_LOG_INFO(
          "pp {}: a step of {} tokens made {} bytes (> a {}-byte slot): recomputing "
          "in chunks of at most {} tokens",
          lid_.ToString(), tokens.size(), size, sender_->payload_capacity(), MaxStepTokens());
      for (uint64_t id : ids) {
        engine_.Release(id);
        requests_[id].cached = 0;
      }
      return false;
    }
    Step st;
    st.ids = ids;
    st.remaining = std::set<uint64_t>(ids.begin(), ids.end());
    st.starts = starts;
    st.counts = counts;
    st.route = route;
    st.ticket = rng_() | 1;
    st.output = *std::move(out);
    for (size_t i = 0; i < ids.size(); ++i) {
      Request& q = requests_[ids[i]];
      q.step = step_id;
      q.sent_to = ends[i];
      q.waiting_since = NowMs();
    }
    if (::connex::internal::LogEnabled(::connex::LogLevel::kTrace)) {
      std::string what;
      for (size_t i = 0; i < ids.size(); ++i) {
        what += StrCat(" ", ids[i], ":", starts[i], "+", counts[i]);
      }
      CONNEX_LOG_TRACE("pp {}: step {}:{}", lid_.ToString(), step_id, what);
    }
    Step& placed = steps_[step_id] = std::move(st);
    SendStep(step_id, placed);
    return true;
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
  uint64_t next_step_ = 1;
  bool lost_ = false;
  int64_t last_prune_ms_ = 0;
  int64_t last_step_ms_ = 0;      // when the last STEP arrived (the drain gate)
  int64_t last_progress_ms_ = 0;  // owner: the last RESULT, or when work began after none
  // Sender side.
  internal::RecentSet<std::pair<Lid, uint64_t>> gone_peers_;  // failed over already
  uint64_t owner_steps_executed_ = 0;                         // stage 0's own engine steps
  uint64_t owner_forged_dropped_ = 0;
  uint64_t strangers_ignored_ = 0;
  EpochLedger ledger_;  // steps executed per epoch (the receiver's and the owner's own)
  // Self-fencing (Admit): whether a step may run under our epoch; created by Start.
  DirectoryLease lease_source_;
  std::unique_ptr<EpochGuard> guard_;
  bool last_ack_matched_ = false;  // the last ACK handled matched a send of ours (FromMember)
  uint64_t subscription_ = 0;      // our own epoch's evictions
  // Owner side.
  std::map<uint64_t, Request> requests_;
  std::map<uint64_t, Step> steps_;
  std::map<uint64_t, std::pair<uint64_t, Lid>> pings_;  // nonce -> (step, the hop pinged)
  std::unique_ptr<ReleaseQueue> releases_;
  uint64_t measured_bytes_per_token_ = 0;
  bool draining_ = false;
  std::atomic<bool> draining_flag_{false};  // draining_, for health() from any thread
  bool operator_draining_ = false;          // an operator's drain began (StartOperatorDrain)
  bool operator_drained_ = false;           // ... and ended (FinishOperatorDrain)
  connex::Mutex drained_mu_;
  std::function<void()> on_drained_ ABSL_GUARDED_BY(drained_mu_);
  std::shared_ptr<std::promise<void>> drained_;  // opened once nothing is in flight
  StageNodeStats stats_;

  std::thread loop_;
  std::atomic<bool> stop_{false};
  connex::Mutex queue_mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopped_ ABSL_GUARDED_BY(queue_mu_) = false;
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
