// StageNode: the public API over StageNode::Impl (internal/node_impl.h), and the Impl's start,
// the commands other threads post to its loop, its stop and migration. The loop itself is
// node_loop.cc.
#include "connex/pp/node.h"

#include "connex/pp/internal/node_impl.h"

namespace connex::pp {

absl::Status StageNode::Impl::Start() {
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
  routes_.SetKvStandby(o_.kv_standby);
  routes_.SetPd(o_.pd_role);
  // A prefill instance hands state over, a decode instance takes it: both need the mirrors.
  const bool pd_instance = o_.pd_role == PdRole::kPrefill || o_.pd_role == PdRole::kDecode;
  if ((o_.kv_standby || pd_instance) && o_.stage != 0) {
    KvStandbyOptions ko;
    ko.self = lid_;
    ko.slot_bytes = o_.slot_bytes;
    ko.budget_bytes = o_.kv_standby_bytes;
    ko.orphan_grace_ms = o_.kv_standby_grace_ms;
    ko.ack_timeout_ms = o_.step_timeout_ms;
    ko.interval_ms = o_.kv_standby_interval_ms;
    ko.clock = clock_;
    ko.first_corr = (rng_() << 16) | 1;
    ko.handoff = Handoff();
    CONNEX_ASSIGN_OR_RETURN(kv_,
                            KvStandby::Create(
                                ko, engine_, *transfer_, [this] { return Self(); },
                                [this](const std::string& a, const Signal& sig) { Send(a, sig); }));
  }
  StepReceiverOptions recv;
  recv.self = lid_;
  recv.stage = o_.stage;
  recv.stages = o_.stages;
  recv.slot_bytes = o_.slot_bytes;
  recv.replay_cache_bytes = o_.replay_cache_bytes;
  recv.executed = &ledger_;
  recv.admit = [this](uint64_t epoch) { return Admit(epoch); };
  recv.standby = kv_.get();
  recv.handoff = Handoff();
  CONNEX_ASSIGN_OR_RETURN(
      receiver_,
      StepReceiver::Create(
          recv, engine_, *transfer_, [reg = reg_] { return reg->epoch(); },
          [this](const std::string& a, const Signal& sig) { Send(a, sig); },
          [this](const StepSignal& step, const TensorDict& out) { Deliver(step, out); }));
  signals_->SetReceiver([this](std::string frame) { Post(std::move(frame)); });
  // The model is watched: the FAILED and LEFT events of our own epochs reach our lease (reg_).
  CONNEX_RETURN_IF_ERROR(dir_.Watch(o_.model));
  // One peer set per stage this node deals with: the one place that knows its live, draining
  // and failed members (directory events, and the transport's peer-death events of the peers
  // it watches).
  CONNEX_RETURN_IF_ERROR(routes_.Watch(dir_, transfer_.get(), lid_,
                                       [this](const elastic::PeerChange& c) { Post(c); }));
  const int64_t lease = dir_.lease_ttl_ms() > 0 ? dir_.lease_ttl_ms() : o_.probe_timeout_ms;
  const int64_t stall_ms = o_.stall_confirm_ms > 0
                               ? o_.stall_confirm_ms
                               : std::max<int64_t>(1, std::min(o_.probe_timeout_ms, lease) / 2);
  guard_ =
      std::make_unique<EpochGuard>(lid_.ToString(), clock_, stall_ms, reg_.get(), &lease_source_);
  CONNEX_RETURN_IF_ERROR(dir_.Join(lid_, Addresses(), JoinMetadata()).status());
  joined_ = true;
  loop_ = std::thread([this] { Run(/*first=*/true); });
  if (o_.stage > 0) follower_ = std::thread([this] { Run(/*first=*/false); });
  queue_.LoopStarted();
  return absl::OkStatus();
}

absl::Status StageNode::Impl::Submit(uint64_t id, std::vector<int32_t> prompt, int max_new,
                                     Completion done, SubmitOptions options) {
  if (o_.stage != 0) {
    return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " is not stage 0"));
  }
  if (prompt.empty()) return absl::InvalidArgumentError(StrCat("request ", id, ": empty prompt"));
  if (max_new <= 0)
    return absl::InvalidArgumentError(StrCat("request ", id, ": max_new_tokens ", max_new));
  if (options.timeout_ms < 0)
    return absl::InvalidArgumentError(StrCat("request ", id, ": timeout_ms ", options.timeout_ms));
  if (absl::Status ok = options.sampling.Validate(); !ok.ok())
    return absl::InvalidArgumentError(StrCat("request ", id, ": ", ok.message()));
  CONNEX_RETURN_IF_ERROR(Health());
  return Call([this, id, prompt = std::move(prompt), max_new, done = std::move(done),
               options = std::move(options)]() mutable -> absl::Status {
    if (drain_->draining()) {  // before the health: a drained node's LID is gone, by design
      return absl::UnavailableError(StrCat("pp: ", lid_.ToString(), " is draining"));
    }
    CONNEX_RETURN_IF_ERROR(Health());
    StopTokens stop{options.ignore_eos, std::move(options.stop_token_ids)};
    return owner_->Add(id, std::move(prompt), max_new, std::move(done), std::move(options.on_token),
                       options.sampling, options.timeout_ms, std::move(stop));
  });
}

absl::Status StageNode::Impl::Cancel(uint64_t id, absl::Status why) {
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
  if (baton_.Leads()) return cancel();
  return Call(std::move(cancel));
}

void StageNode::Impl::CancelLater(uint64_t id, absl::Status why) {
  if (o_.stage != 0) return;
  if (why.ok()) why = absl::CancelledError("cancelled");
  Command cmd;
  cmd.run = [this, id, why] { owner_->Finish(id, why); };  // ignores a request not running
  (void)PostCommand(std::move(cmd));
}

void StageNode::Impl::Stop(bool leave, int64_t drain_timeout_ms) {
  if (leave && !IsStopped()) {
    // LEFT first, so that owners stop routing new steps here; then finish what is in flight.
    // The gate: the loop opens `drained` once nothing of ours is in flight.
    auto drained = std::make_shared<std::promise<void>>();
    auto future = drained->get_future();
    Command cmd;
    cmd.run = [this, drained] { drain_->BeginLeave(drained); };
    cmd.cancel = [drained] { drained->set_value(); };
    if (PostCommand(std::move(cmd))) {
      if (joined_) (void)dir_.Leave(lid_);
      joined_ = false;
      (void)future.wait_for(std::chrono::milliseconds(drain_timeout_ms));
    }
  }
  StopLoop();
}

absl::Status StageNode::Impl::Migrate(std::unique_ptr<SignalTransport> signals) {
  CONNEX_RETURN_IF_ERROR(Health());
  SignalTransport* fresh = signals.get();
  fresh->SetReceiver([this](std::string frame) { Post(std::move(frame)); });
  return Call([this, s = std::shared_ptr<SignalTransport>(std::move(signals))]() mutable {
    std::unique_ptr<SignalTransport> old = std::move(signals_);
    signals_.reset(new ForwardingTransport(std::move(s)));
    absl::StatusOr<uint64_t> epoch = dir_.Join(lid_, Addresses(), JoinMetadata());
    old->Close();
    retired_.push_back(std::move(old));
    while (retired_.size() > kRetiredTransports) retired_.pop_front();
    return epoch.status();
  });
}

std::map<std::string, std::string> StageNode::Impl::JoinMetadata() const {
  std::map<std::string, std::string> m = o_.metadata;
  std::string groups;
  if (o_.pd_role != PdRole::kNone) {
    // PD: a frontend reports the instances it sends steps to; an instance reports nobody.
    if (o_.pd_role == PdRole::kFrontend) groups = StrCat(kPdPrefillGroup, ",", kPdDecodeGroup);
  } else {
    for (uint32_t g = 0; g < o_.stages; ++g) {
      if (DealsWith(o_.stage, g)) groups += StrCat(groups.empty() ? "" : ",", g);
    }
  }
  m.emplace(std::string(directory::kPeerGroupsKey), groups);
  return m;
}

Hop StageNode::Impl::Self() const {
  Hop h;
  h.lid = lid_;
  h.epoch = reg_->epoch();
  h.signal = signals_->address();
  h.addresses = transfer_->LocalAddresses();
  return h;
}

absl::Status StageNode::Impl::Call(std::function<absl::Status()> fn) {
  auto result = std::make_shared<std::promise<absl::Status>>();
  auto future = result->get_future();
  Command cmd;
  cmd.run = [fn = std::move(fn), result] { result->set_value(fn()); };
  cmd.cancel = [this, result] { result->set_value(StoppedError()); };
  if (!PostCommand(std::move(cmd))) return StoppedError();
  return future.get();
}

void StageNode::Impl::StopLoop() {
  if (!queue_.Close()) return;
  stop_.store(true);
  if (loop_.joinable()) loop_.join();
  if (follower_.joinable()) follower_.join();
  std::deque<Item> left = queue_.TakeAll();
  left.insert(left.begin(), std::make_move_iterator(batch_.begin()),
              std::make_move_iterator(batch_.end()));
  batch_.clear();
  for (Item& item : left) {
    if (auto* cmd = std::get_if<Command>(&item)) {
      if (cmd->cancel) cmd->cancel();
    }
  }
  routes_.Clear();  // no peer-set callbacks after this
  signals_->Close();
  owner_->DropAll(absl::CancelledError(StrCat("pp: ", lid_.ToString(), " stopped")));
  drain_->Stopped();
  sender_.reset();
  receiver_.reset();
  kv_.reset();  // after the receiver, which asks it
}

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
bool StageNode::Turning(int64_t within_ms) const { return impl_->Turning(within_ms); }
StageNodeStats StageNode::stats() const { return impl_->Stats(); }

}  // namespace connex::pp
