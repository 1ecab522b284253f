#include "connex/pp/node.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <variant>

#include "connex/base/clock.h"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/messages.h"
#include "connex/pp/send_ring.h"

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
  return o;
}

namespace {

constexpr std::string_view kSignalScheme = "pp+";
constexpr size_t kSeenCorrs = 8192;
constexpr size_t kExecutedSteps = 2048;

using Clk = std::chrono::steady_clock;

int64_t NowMs() { return RealClock::Get()->NowMs(); }

Hop HopFromRecord(const directory::Record& r) {
  Hop hop;
  hop.lid = r.lid;
  hop.epoch = r.epoch;
  for (const std::string& a : r.addresses) {
    if (a.rfind(kSignalScheme, 0) == 0) {
      hop.signal = a;
    } else if (a.rfind("zmq+", 0) != 0) {
      hop.addresses.push_back(a);
    }
  }
  return hop;
}

transport::PeerRef PeerOf(const Hop& hop) { return transport::PeerRef{hop.lid, hop.addresses}; }

std::string RouteKey(const std::vector<Hop>& route) {
  std::string key;
  for (const Hop& h : route) key += StrCat(h.lid.ToString(), "@", h.epoch, ";");
  return key;
}

// Keeps the requests of `in` for which keep[i] is true. Tensors whose first dimension is the
// token count N are sliced by token ranges, those whose first dimension is B by request.
TensorDict Select(const TensorDict& in, const Batch& batch, const std::vector<bool>& keep) {
  const int64_t b = static_cast<int64_t>(batch.request_ids.size());
  int64_t n = 0;
  for (int32_t c : batch.num_tokens) n += c;
  std::vector<uint64_t> ids;
  std::vector<int32_t> starts, counts;
  for (int64_t i = 0; i < b; ++i) {
    if (!keep[i]) continue;
    ids.push_back(batch.request_ids[i]);
    starts.push_back(batch.start_positions[i]);
    counts.push_back(batch.num_tokens[i]);
  }
  TensorDict out;
  SetBatch(out, ids, starts, counts);
  for (const auto& [name, t] : in.tensors()) {
    if (name == kRequestIds || name == kStartPositions || name == kNumTokens) continue;
    if (t.shape.empty() || (t.shape[0] != n && t.shape[0] != b)) {
      out.Set(name, t);
      continue;
    }
    const bool by_token = t.shape[0] == n;
    const size_t row = t.shape[0] == 0 ? 0 : t.data.size() / static_cast<size_t>(t.shape[0]);
    Tensor s;
    s.dtype = t.dtype;
    s.shape = t.shape;
    int64_t rows = 0;
    int64_t offset = 0;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t len = by_token ? batch.num_tokens[i] : 1;
      if (keep[i]) {
        s.data.insert(s.data.end(), t.data.begin() + offset * row,
                      t.data.begin() + (offset + len) * row);
        rows += len;
      }
      offset += len;
    }
    s.shape[0] = rows;
    out.Set(name, std::move(s));
  }
  return out;
}

}  // namespace

class StageNode::Impl {
 public:
  Impl(StageNodeOptions options, Engine& engine, transport::TransferEnginePtr transfer,
       std::unique_ptr<SignalTransport> signals, directory::DirectoryClient& directory)
      : o_(std::move(options)),
        engine_(engine),
        transfer_(std::move(transfer)),
        signals_(std::move(signals)),
        dir_(directory),
        lid_{o_.model, o_.stage, 0, o_.replica} {
    std::random_device rd;
    next_corr_ = (static_cast<uint64_t>(rd()) << 32) | 1;
    next_step_ = (static_cast<uint64_t>(rd() & 0xffff) << 40) | 1;
  }

  ~Impl() { StopLoop(); }

  absl::Status Start() {
    if (o_.stages == 0 || o_.stage >= o_.stages) {
      return absl::InvalidArgumentError(StrCat("pp: stage ", o_.stage, " of ", o_.stages));
    }
    CONNEX_ASSIGN_OR_RETURN(ring_, SendRing::Create(*transfer_, static_cast<size_t>(o_.ring_slots),
                                                    static_cast<size_t>(o_.slot_bytes)));
    CONNEX_ASSIGN_OR_RETURN(recv_buf_, transfer_->AllocateManagedBuffer(o_.slot_bytes));
    CONNEX_ASSIGN_OR_RETURN(check_buf_, transfer_->AllocateManagedBuffer(kSlotHeaderBytes));
    peer_sub_ = transfer_->SubscribePeerEvents([this](const transport::PeerEvent& e) { Post(e); });
    signals_->SetReceiver([this](std::string frame) { Post(std::move(frame)); });
    dir_sub_ = dir_.Subscribe([this](const directory::Event& e) { Post(e); });
    // The client may outlive this node: the callback holds the epoch, not the node.
    dir_.OnRegistrationChange([epoch = epoch_, lid = lid_](const directory::RegistrationChange& c) {
      if (c.lid == lid && c.status.ok()) epoch->store(c.new_epoch);
    });
    CONNEX_RETURN_IF_ERROR(dir_.Watch(o_.model));
    CONNEX_ASSIGN_OR_RETURN(uint64_t epoch, dir_.Join(lid_, Addresses()));
    epoch_->store(epoch);
    loop_ = std::thread([this] { Run(); });
    reporter_ = std::thread([this] { ReportLoop(); });
    return absl::OkStatus();
  }

  absl::Status Submit(uint64_t id, std::vector<int32_t> prompt, int max_new, Completion done,
                      StageNode::TokenCallback on_token) {
    if (o_.stage != 0) {
      return absl::FailedPreconditionError(StrCat("pp: ", lid_.ToString(), " is not stage 0"));
    }
    if (prompt.empty()) return absl::InvalidArgumentError(StrCat("request ", id, ": empty prompt"));
    if (max_new <= 0)
      return absl::InvalidArgumentError(StrCat("request ", id, ": max_new_tokens ", max_new));
    absl::Status result;
    auto accepted = std::make_shared<std::promise<absl::Status>>();
    auto future = accepted->get_future();
    Post(std::function<void()>([this, id, prompt = std::move(prompt), max_new,
                                done = std::move(done), on_token = std::move(on_token),
                                accepted]() mutable {
      if (draining_) {
        accepted->set_value(
            absl::UnavailableError(StrCat("pp: ", lid_.ToString(), " is draining")));
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
      r.on_token = std::move(on_token);
      r.waiting_since = NowMs();
      requests_.emplace(id, std::move(r));
      accepted->set_value(absl::OkStatus());
    }));
    if (future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      return absl::DeadlineExceededError("pp: the node's loop did not accept the request");
    }
    return future.get();
  }

  void Stop(bool leave, int64_t drain_timeout_ms) {
    if (leave) {
      // LEFT first, so that owners stop routing new steps here; then finish what is in flight.
      Post(std::function<void()>([this] { draining_ = true; }));
      (void)dir_.Leave(lid_);
      auto deadline = NowMs() + drain_timeout_ms;
      while (NowMs() < deadline) {
        StageNodeStats s = Stats();
        bool quiet = NowMs() - last_step_ms_.load() > 100;
        if (s.steps_in_flight == 0 && s.ring_in_use == 0 && quiet) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    StopLoop();
  }

  absl::Status Migrate(std::unique_ptr<SignalTransport> signals) {
    auto done = std::make_shared<std::promise<absl::Status>>();
    auto future = done->get_future();
    SignalTransport* fresh = signals.get();
    fresh->SetReceiver([this](std::string frame) { Post(std::move(frame)); });
    Post(std::function<void()>(
        [this, s = std::shared_ptr<SignalTransport>(std::move(signals)), done]() mutable {
          std::unique_ptr<SignalTransport> old = std::move(signals_);
          signals_.reset(new ForwardingTransport(std::move(s)));
          absl::StatusOr<uint64_t> epoch = dir_.Join(lid_, Addresses());
          if (epoch.ok()) epoch_->store(*epoch);
          old->Close();
          retired_.push_back(std::move(old));
          done->set_value(epoch.status());
        }));
    return future.get();
  }

  const Lid& lid() const { return lid_; }
  uint64_t epoch() const { return epoch_->load(); }
  StageNodeStats Stats() const {
    connex::MutexLock lock(&stats_mu_);
    return stats_snapshot_;
  }

 private:
  // Wraps a shared transport (Migrate's lambda can only capture copyable state).
  class ForwardingTransport : public SignalTransport {
   public:
    explicit ForwardingTransport(std::shared_ptr<SignalTransport> t) : t_(std::move(t)) {}
    const std::string& address() const override { return t_->address(); }
    void SetReceiver(Receiver r) override { t_->SetReceiver(std::move(r)); }
    void Send(const std::string& a, std::string f) override { t_->Send(a, std::move(f)); }
    void Close() override { t_->Close(); }

   private:
    std::shared_ptr<SignalTransport> t_;
  };

  using Item =
      std::variant<std::string, transport::PeerEvent, directory::Event, std::function<void()>>;

  struct Request {
    std::vector<int32_t> tokens;  // prompt, then generated
    size_t prompt_len = 0;
    int max_new = 0;
    size_t cached = 0;  // positions the route holds
    std::vector<Hop> route;
    std::set<Lid> visited;  // stages that may hold state, released at the end
    uint64_t step = 0;      // in flight; 0 none
    int reprefills = 0;
    int64_t waiting_since = 0;  // for a route
    Completion done;
    StageNode::TokenCallback on_token;
  };
  struct Step {
    uint32_t attempt = 1;
    std::vector<uint64_t> ids;
    std::set<uint64_t> remaining;
    std::vector<int32_t> starts, counts;
    std::vector<Hop> route;
    TensorDict output;  // stage 0's, kept to re-send
    int64_t deadline = 0;
    int64_t probe_until = 0;  // probing when > 0
    std::set<Lid> ponged;
    int64_t resend_at = 0;  // a re-send waits for a slot, a route or a backoff when > 0
    bool sent = false;
  };
  struct Outgoing {
    Lid owner_lid;
    std::string owner_signal;
    uint64_t step = 0;
    uint32_t attempt = 0;
    uint32_t hop = 0;
    Lid target;
    int64_t deadline = 0;
  };
  struct PendingSend {
    StepSignal signal;  // everything but corr, remote_addr, length, layout
    TensorDict payload;
  };
  struct Executed {
    TensorDict output;
  };

  std::vector<std::string> Addresses() const {
    std::vector<std::string> a = transfer_->LocalAddresses();
    a.push_back(signals_->address());
    return a;
  }

  Hop Self() const {
    Hop h;
    h.lid = lid_;
    h.epoch = epoch_->load();
    h.signal = signals_->address();
    h.addresses = transfer_->LocalAddresses();
    return h;
  }

  void Post(Item item) {
    connex::MutexLock lock(&queue_mu_);
    queue_.push_back(std::move(item));
  }

  void StopLoop() {
    {
      connex::MutexLock lock(&queue_mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    stop_.store(true);
    if (loop_.joinable()) loop_.join();
    {
      connex::MutexLock lock(&report_mu_);
      report_stop_ = true;
    }
    if (reporter_.joinable()) reporter_.join();
    dir_.Unsubscribe(dir_sub_);
    transfer_->UnsubscribePeerEvents(peer_sub_);
    signals_->Close();
    for (auto& [id, r] : requests_) {
      if (r.done) r.done(id, absl::CancelledError(StrCat("pp: ", lid_.ToString(), " stopped")));
    }
    requests_.clear();
    ring_.reset();
    if (recv_buf_ != nullptr) (void)transfer_->FreeManagedBuffer(recv_buf_);
    if (check_buf_ != nullptr) (void)transfer_->FreeManagedBuffer(check_buf_);
    recv_buf_ = nullptr;
    check_buf_ = nullptr;
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
      for (Item& item : items) {
        if (stop_.load()) break;
        if (auto* frame = std::get_if<std::string>(&item)) {
          HandleFrame(*frame);
        } else if (auto* pe = std::get_if<transport::PeerEvent>(&item)) {
          HandlePeerEvent(*pe);
        } else if (auto* de = std::get_if<directory::Event>(&item)) {
          HandleDirectoryEvent(*de);
        } else if (auto* cmd = std::get_if<std::function<void()>>(&item)) {
          (*cmd)();
        }
      }
      now = NowMs();
      RunTimers(now);
      FlushPending();
      if (o_.stage == 0) Schedule(now);
      PublishStats();
    }
  }

  int64_t NextTimer(int64_t now) const {
    int64_t next = now + 20;
    for (const auto& [corr, out] : outgoing_) next = std::min(next, out.deadline);
    for (const auto& [id, st] : steps_) {
      next = std::min(next, st.probe_until > 0 ? st.probe_until : st.deadline);
      if (st.resend_at > 0) next = std::min(next, st.resend_at);
    }
    return next;
  }

  void PublishStats() {
    stats_.ring_in_use = ring_ ? ring_->in_use() : 0;
    stats_.requests_in_flight = requests_.size();
    stats_.steps_in_flight = steps_.size() + pending_.size();
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
  }

  void On(StepSignal& s) {
    const Hop& target = s.target();
    AckSignal ack;
    ack.corr = s.corr;
    ack.from = lid_;
    if (target.lid != lid_ || target.epoch != epoch_->load()) {
      ++stats_.fenced;
      ack.code = static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition);
      ack.message = StrCat(lid_.ToString(), ": step for ", target.lid.ToString(), " epoch ",
                           target.epoch, " refused, this is epoch ", epoch_->load());
      Send(s.origin.signal, ack);
      return;
    }
    if (seen_corr_.count(s.corr)) {
      ++stats_.duplicates_dropped;
      Send(s.origin.signal, ack);  // the first ACK may have been lost
      return;
    }
    Remember(s.corr);
    last_step_ms_.store(NowMs());
    // Pull the payload.
    uint64_t total = kSlotHeaderBytes + s.length;
    if (total > static_cast<uint64_t>(o_.slot_bytes)) {
      ack.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
      ack.message = StrCat("payload of ", s.length, " bytes exceeds this stage's slot");
      Send(s.origin.signal, ack);
      return;
    }
    absl::Status read =
        transfer_->TransferSyncRead(PeerOf(s.origin), recv_buf_, s.remote_addr, total);
    SlotHeader header{};
    if (read.ok()) {
      std::memcpy(&header, recv_buf_, sizeof(header));
      if (header.corr != s.corr || header.length != s.length) {
        read = absl::AbortedError("payload was replaced before it was read (stale slot)");
      }
    }
    if (!read.ok()) {
      ack.code = static_cast<uint32_t>(read.code());
      ack.message = std::string(read.message());
      Send(s.origin.signal, ack);
      return;
    }
    absl::StatusOr<TensorDict> in =
        Unpack(s.layout, static_cast<const uint8_t*>(recv_buf_) + kSlotHeaderBytes, s.length);
    Send(s.origin.signal, ack);  // the slot is free: the payload is ours
    if (!in.ok()) {
      CONNEX_LOG_WARN("pp {}: bad payload of step {}: {}", lid_.ToString(), s.step,
                      AsStd(in.status().message()));
      return;
    }
    absl::StatusOr<Batch> batch = GetBatch(*in);
    if (!batch.ok()) {
      CONNEX_LOG_WARN("pp {}: bad batch in step {}: {}", lid_.ToString(), s.step,
                      AsStd(batch.status().message()));
      return;
    }
    // Step ids grow per owner, so a request's last executed step tells an old attempt (or a
    // late duplicate) from a new step: a step is never executed twice on a stage, and a request
    // that has moved on is never taken back.
    auto key = std::make_pair(s.owner.lid, s.step);
    auto done = executed_.find(key);
    if (done != executed_.end()) {
      // A re-sent attempt of a step this stage already ran: answer from the output cache, for
      // the requests the owner still waits for.
      std::set<uint64_t> wanted(s.request_ids.begin(), s.request_ids.end());
      absl::StatusOr<Batch> cached = GetBatch(done->second.output);
      if (!cached.ok()) return;
      std::vector<bool> keep;
      bool any = false;
      for (uint64_t id : cached->request_ids) {
        auto last = last_step_.find(id);
        keep.push_back(wanted.count(id) && last != last_step_.end() && last->second == s.step);
        any |= keep.back();
      }
      if (!any) return;
      ++stats_.steps_replayed;
      Deliver(s, Select(done->second.output, *cached, keep));
      return;
    }
    std::vector<bool> keep;
    std::vector<uint64_t> lost;
    for (uint64_t id : batch->request_ids) {
      auto last = last_step_.find(id);
      bool fresh = last == last_step_.end() || last->second < s.step;
      if (!fresh && last->second == s.step) lost.push_back(id);  // ran, but the output is gone
      keep.push_back(fresh);
    }
    TensorDict runnable = Select(*in, *batch, keep);
    std::vector<uint64_t> missing = engine_.MissingRequests(runnable);
    missing.insert(missing.end(), lost.begin(), lost.end());
    if (!missing.empty()) {
      ++stats_.missing_reported;
      Send(s.owner.signal, MissingSignal{s.step, s.attempt, lid_, missing});
    }
    {
      std::set<uint64_t> m(missing.begin(), missing.end());
      bool any = false;
      for (size_t i = 0; i < keep.size(); ++i) {
        keep[i] = keep[i] && !m.count(batch->request_ids[i]);
        any |= keep[i];
      }
      if (!any) return;
      runnable = Select(*in, *batch, keep);
    }
    absl::StatusOr<TensorDict> out = engine_.ExecuteStep(runnable);
    if (!out.ok()) {
      CONNEX_LOG_WARN("pp {}: step {} failed: {}", lid_.ToString(), s.step,
                      AsStd(out.status().message()));
      absl::StatusOr<Batch> b = GetBatch(runnable);
      if (b.ok()) Send(s.owner.signal, MissingSignal{s.step, s.attempt, lid_, b->request_ids});
      return;
    }
    ++stats_.steps_executed;
    for (size_t i = 0; i < keep.size(); ++i) {
      if (keep[i]) last_step_[batch->request_ids[i]] = s.step;
    }
    executed_[key] = Executed{*out};
    executed_order_.push_back(key);
    while (executed_order_.size() > kExecutedSteps) {
      executed_.erase(executed_order_.front());
      executed_order_.pop_front();
    }
    Deliver(s, *out);
  }

  // Hands a stage's output on: to the next hop, or (last stage) the tokens to the owner.
  void Deliver(const StepSignal& s, const TensorDict& out) {
    if (o_.stage + 1 == o_.stages) {
      absl::StatusOr<Batch> b = GetBatch(out);
      absl::StatusOr<const Tensor*> next = out.Get(kNextTokens, DType::kI32, 1);
      if (!b.ok() || !next.ok()) {
        CONNEX_LOG_ERROR("pp {}: the engine's last-stage output lacks {}", lid_.ToString(),
                         kNextTokens);
        return;
      }
      auto tokens = (*next)->values<int32_t>();
      ResultSignal r{s.step, s.attempt, lid_, b->request_ids,
                     std::vector<int32_t>(tokens.begin(), tokens.end())};
      Send(s.owner.signal, r);
      return;
    }
    if (s.hop + 1 >= s.route.size()) {
      CONNEX_LOG_ERROR("pp {}: step {} has no hop after {}", lid_.ToString(), s.step, s.hop);
      return;
    }
    PendingSend p;
    p.signal = s;
    p.signal.hop = s.hop + 1;
    p.signal.origin = Self();
    p.payload = out;
    Forward(std::move(p));
  }

  void Forward(PendingSend p) {
    if (!pending_.empty() || !TrySend(p)) {
      ++stats_.backpressured;
      pending_.push_back(std::move(p));
    }
  }

  void FlushPending() {
    while (!pending_.empty() && TrySend(pending_.front())) pending_.pop_front();
  }

  // Copies the payload into a ring slot and signals the target. False when the ring is full.
  bool TrySend(PendingSend& p) {
    uint64_t corr = next_corr_++;
    std::optional<uint32_t> slot = ring_->Acquire(corr);
    if (!slot) return false;
    StepSignal& s = p.signal;
    uint64_t size = PackedSize(p.payload);
    if (size > ring_->payload_capacity()) {
      ring_->Release(corr);
      CONNEX_LOG_ERROR(
          "pp {}: step {} payload of {} bytes exceeds a ring slot ({}); raise "
          "CONNEX_PP_SLOT_BYTES",
          lid_.ToString(), s.step, size, ring_->payload_capacity());
      HopFailed(s.owner, s.step, s.attempt, s.hop, absl::StatusCode::kResourceExhausted,
                "payload too large");
      return true;
    }
    s.layout = Pack(p.payload, ring_->payload(*slot));
    ring_->Seal(*slot, corr, size);
    s.corr = corr;
    s.remote_addr = ring_->remote_addr(*slot);
    s.length = size;
    const Hop& target = s.target();
    WatchPeer(target);
    outgoing_[corr] = Outgoing{s.owner.lid,
                               s.owner.signal,
                               s.step,
                               s.attempt,
                               s.hop,
                               target.lid,
                               NowMs() + o_.step_timeout_ms};
    Send(target.signal, s);
    return true;
  }

  void WatchPeer(const Hop& hop) {
    auto key = std::make_pair(hop.lid, hop.epoch);
    if (watched_.count(key)) return;
    watched_.emplace(key, hop.addresses);
    absl::Status c = transfer_->Connect(PeerOf(hop));
    if (!c.ok()) {
      CONNEX_LOG_DEBUG("pp {}: cannot watch {}: {}", lid_.ToString(), hop.lid.ToString(),
                       AsStd(c.message()));
    }
  }

  void On(AckSignal& a) {
    auto it = outgoing_.find(a.corr);
    if (it == outgoing_.end()) {
      ring_->Release(a.corr);
      return;
    }
    Outgoing out = it->second;
    outgoing_.erase(it);
    ring_->Release(a.corr);
    if (a.code != 0) {
      HopFailed(Hop{out.owner_lid, 0, out.owner_signal, {}}, out.step, out.attempt, out.hop,
                static_cast<absl::StatusCode>(a.code), a.message);
    }
  }

  // Tells the owner that hop `hop` of its step could not be reached (or handles it, if we are
  // the owner).
  void HopFailed(const Hop& owner, uint64_t step, uint32_t attempt, uint32_t hop,
                 absl::StatusCode code, const std::string& reason) {
    HopFailedSignal f{step, attempt, lid_, hop, static_cast<uint32_t>(code), reason};
    if (owner.lid == lid_) {
      On(f);
    } else {
      Send(owner.signal, f);
    }
  }

  void Remember(uint64_t corr) {
    seen_corr_.insert(corr);
    seen_order_.push_back(corr);
    while (seen_order_.size() > kSeenCorrs) {
      seen_corr_.erase(seen_order_.front());
      seen_order_.pop_front();
    }
  }

  void On(ReleaseSignal& r) {
    for (uint64_t id : r.request_ids) {
      engine_.Release(id);
      last_step_.erase(id);
    }
  }

  void On(PingSignal& p) { Send(p.reply_to, PongSignal{p.nonce, lid_, epoch_->load()}); }

  void On(PongSignal& p) {
    auto it = pings_.find(p.nonce);
    if (it == pings_.end()) return;
    auto st = steps_.find(it->second);
    if (st != steps_.end()) st->second.ponged.insert(p.from);
    pings_.erase(it);
  }

  // ---- failure signals ----

  void HandlePeerEvent(const transport::PeerEvent& e) {
    if (e.kind == transport::PeerEventKind::kSuspected) {
      CONNEX_LOG_INFO("pp {}: {} suspected ({})", lid_.ToString(), e.lid.ToString(), e.detail);
      return;  // only a suspicion: the step timeout and the probe decide
    }
    if (e.kind != transport::PeerEventKind::kDead) return;
    // Connections are keyed by LID; the address tells which incarnation (epoch) died, so that
    // a late event about a restarted endpoint's previous process does not condemn the new one.
    std::optional<uint64_t> epoch = EpochOfConnection(e.lid, e.address);
    if (!epoch) return;
    PeerGone(e.lid, *epoch, StrCat("transport: ", e.detail), /*graceful=*/false);
    // Tell everyone: if the peer is in fact alive, it learns it was evicted and joins again
    // under a new epoch, rather than being avoided by this sender only.
    Report(e.lid, *epoch);
  }

  std::optional<uint64_t> EpochOfConnection(const Lid& lid, const std::string& address) const {
    std::optional<uint64_t> best;
    for (const auto& [key, addresses] : watched_) {
      if (key.first != lid) continue;
      bool match = address.empty() ||
                   std::find(addresses.begin(), addresses.end(), address) != addresses.end();
      if (match && (!best || key.second > *best)) best = key.second;
    }
    return best;
  }

  void HandleDirectoryEvent(const directory::Event& e) {
    if (e.record.lid.model != o_.model) return;
    switch (e.kind) {
      case directory::EventKind::kFailed:
        PeerGone(e.record.lid, e.record.epoch, StrCat("directory: FAILED ", e.reason), false);
        break;
      case directory::EventKind::kLeft:
        PeerGone(e.record.lid, e.record.epoch, "directory: LEFT", true);
        break;
      case directory::EventKind::kMigrated:
        // Same process at a new address: steps fenced at the old epoch come back as HOP_FAILED
        // and are re-sent along the refreshed route.
        break;
      case directory::EventKind::kJoined:
        break;
    }
  }

  // (lid, epoch) is gone. Graceful (LEFT): no new steps go there, in-flight ones finish.
  void PeerGone(const Lid& lid, uint64_t epoch, const std::string& why, bool graceful) {
    if (lid == lid_) return;
    auto key = std::make_pair(lid, epoch);
    if (graceful) {
      draining_peers_.insert(key);
      return;
    }
    if (!dead_.insert(key).second) return;
    CONNEX_LOG_INFO("pp {}: {} epoch {} is gone ({})", lid_.ToString(), lid.ToString(), epoch, why);
    // Slots waiting for the dead peer's acknowledgement are free; its steps fail over.
    std::vector<uint64_t> gone;
    for (const auto& [corr, out] : outgoing_) {
      if (out.target == lid) gone.push_back(corr);
    }
    for (uint64_t corr : gone) {
      Outgoing out = outgoing_[corr];
      outgoing_.erase(corr);
      ring_->Release(corr);
      HopFailed(Hop{out.owner_lid, 0, out.owner_signal, {}}, out.step, out.attempt, out.hop,
                absl::StatusCode::kUnavailable, why);
    }
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

  // ---- the owner ----

  void On(ResultSignal& r) {
    auto it = steps_.find(r.step);
    if (it == steps_.end() || it->second.attempt != r.attempt) {
      ++stats_.late_dropped;
      return;
    }
    Step& st = it->second;
    for (size_t i = 0; i < r.request_ids.size(); ++i) {
      uint64_t id = r.request_ids[i];
      if (!st.remaining.erase(id)) continue;
      auto req = requests_.find(id);
      if (req == requests_.end()) continue;
      Request& q = req->second;
      q.step = 0;
      q.cached = q.tokens.size();
      q.tokens.push_back(r.tokens[i]);
      if (q.on_token) q.on_token(id, r.tokens[i]);
      size_t generated = q.tokens.size() - q.prompt_len;
      if (static_cast<int>(generated) >= q.max_new || r.tokens[i] == o_.eos_token) {
        Finish(id, absl::OkStatus());
      }
    }
    if (st.remaining.empty()) steps_.erase(it);
  }

  void On(MissingSignal& m) {
    auto it = steps_.find(m.step);
    if (it == steps_.end() || it->second.attempt != m.attempt) {
      ++stats_.late_dropped;
      return;
    }
    Step& st = it->second;
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
    if (st.remaining.empty()) steps_.erase(it);
  }

  void On(HopFailedSignal& f) {
    auto it = steps_.find(f.step);
    if (it == steps_.end() || it->second.attempt != f.attempt) return;
    Step& st = it->second;
    if (st.resend_at > 0) return;
    // Back off a little so that a peer whose death is not known yet does not spin the step.
    st.resend_at = NowMs() + std::min<int64_t>(200, 5 << std::min<uint32_t>(st.attempt, 5));
    CONNEX_LOG_DEBUG("pp {}: step {} attempt {}: hop {} failed: {}", lid_.ToString(), f.step,
                     f.attempt, f.hop, f.reason);
  }

  void Finish(uint64_t id, absl::Status status) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    Request q = std::move(it->second);
    requests_.erase(it);
    engine_.Release(id);
    for (const Lid& lid : q.visited) {
      for (const directory::Record& rec : dir_.View(o_.model, lid.group)) {
        if (rec.lid == lid) Send(HopFromRecord(rec).signal, ReleaseSignal{lid_, {id}});
      }
    }
    if (status.ok()) {
      ++stats_.completed;
      if (q.done) q.done(id, std::vector<int32_t>(q.tokens.begin() + q.prompt_len, q.tokens.end()));
    } else {
      ++stats_.aborted;
      CONNEX_LOG_WARN("pp {}: {}", lid_.ToString(), AsStd(status.message()));
      if (q.done) q.done(id, status);
    }
  }

  bool Usable(const Lid& lid, uint64_t epoch) const {
    auto key = std::make_pair(lid, epoch);
    return !dead_.count(key) && !draining_peers_.count(key);
  }

  // Why no route can be built: per stage without a usable replica, what the view shows.
  std::string RouteProblem() const {
    std::string out;
    for (uint32_t g = 1; g < o_.stages; ++g) {
      std::vector<directory::Record> records = dir_.View(o_.model, g);
      std::string seen;
      bool usable = false;
      for (const directory::Record& r : records) {
        auto key = std::make_pair(r.lid, r.epoch);
        std::string state = dead_.count(key)             ? "dead"
                            : draining_peers_.count(key) ? "draining"
                                                         : "live";
        usable |= state == "live";
        seen += StrCat(seen.empty() ? "" : ", ", "r", r.lid.replica, "@", r.epoch, " ", state);
      }
      if (!usable)
        out += StrCat(out.empty() ? "" : "; ", "stage ", g, ": ",
                      seen.empty() ? "no replica registered" : seen);
    }
    return out;
  }

  // The usable hops of stages 1..N-1 (index g-1), from the directory's view.
  using LiveHops = std::vector<std::vector<Hop>>;
  LiveHops CollectLiveHops() {
    LiveHops out(o_.stages > 0 ? o_.stages - 1 : 0);
    for (uint32_t g = 1; g < o_.stages; ++g) {
      for (const directory::Record& r : dir_.View(o_.model, g)) {
        if (r.lid.shard != 0 || !Usable(r.lid, r.epoch)) continue;
        Hop h = HopFromRecord(r);
        if (h.signal.empty()) continue;
        out[g - 1].push_back(std::move(h));
      }
    }
    return out;
  }

  // A route through stages 1..N-1 from the directory's view: the current hop of each stage if
  // it is still live (sticky per request), else the caller's own replica, else the next live
  // replica after it. Nullopt when some stage has no live replica.
  std::optional<std::vector<Hop>> BuildRoute(const std::vector<Hop>& current) {
    return BuildRoute(current, CollectLiveHops());
  }

  // As above, from hops collected once for many requests (Schedule).
  std::optional<std::vector<Hop>> BuildRoute(const std::vector<Hop>& current,
                                             const LiveHops& live_hops) {
    std::vector<Hop> route;
    for (uint32_t g = 1; g < o_.stages; ++g) {
      const std::vector<Hop>& live = live_hops[g - 1];
      if (live.empty()) return std::nullopt;
      const Hop* pick = nullptr;
      if (current.size() == o_.stages - 1) {
        for (const Hop& h : live) {
          if (h.lid == current[g - 1].lid) pick = &h;
        }
      }
      if (pick == nullptr) {
        const Hop* lowest = nullptr;
        for (const Hop& h : live) {
          if (lowest == nullptr || h.lid.replica < lowest->lid.replica) lowest = &h;
          if (h.lid.replica >= o_.replica &&
              (pick == nullptr || h.lid.replica < pick->lid.replica)) {
            pick = &h;
          }
        }
        if (pick == nullptr) pick = lowest;
      }
      route.push_back(*pick);
    }
    return route;
  }

  void Resend(uint64_t step_id, const std::string& why) {
    auto it = steps_.find(step_id);
    if (it == steps_.end()) return;
    Step& st = it->second;
    ++st.attempt;
    ++stats_.resends;
    st.probe_until = 0;
    st.ponged.clear();
    st.resend_at = 0;
    std::optional<std::vector<Hop>> route = BuildRoute(st.route);
    if (!route) {
      st.resend_at = NowMs() + 50;  // wait for a replica to appear
      st.deadline = NowMs() + o_.step_timeout_ms;
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
      for (const Hop& h : *route) req->second.visited.insert(h.lid);
    }
    SendStep(step_id, st);
  }

  void CheckRouteWait(Step& st) {
    for (uint64_t id : std::vector<uint64_t>(st.remaining.begin(), st.remaining.end())) {
      auto req = requests_.find(id);
      if (req == requests_.end()) continue;
      if (NowMs() - req->second.waiting_since > o_.route_wait_ms) {
        st.remaining.erase(id);
        Finish(id,
               absl::UnavailableError(StrCat("request ", id, ": no live replica of some stage for ",
                                             o_.route_wait_ms, " ms (", RouteProblem(), ")")));
      }
    }
  }

  void SendStep(uint64_t step_id, Step& st) {
    PendingSend p;
    StepSignal& s = p.signal;
    s.step = step_id;
    s.attempt = st.attempt;
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
    p.payload = s.request_ids.size() == st.ids.size() ? st.output : Select(st.output, batch, keep);
    st.deadline = NowMs() + o_.step_timeout_ms;
    st.sent = true;
    for (const Hop& h : st.route) WatchPeer(h);
    Forward(std::move(p));
  }

  void RunTimers(int64_t now) {
    // Unacknowledged slots: give them up (the header check stops a late reader).
    std::vector<uint64_t> expired;
    for (const auto& [corr, out] : outgoing_) {
      if (out.deadline <= now) expired.push_back(corr);
    }
    for (uint64_t corr : expired) {
      Outgoing out = outgoing_[corr];
      outgoing_.erase(corr);
      ring_->Release(corr);
      HopFailed(Hop{out.owner_lid, 0, out.owner_signal, {}}, out.step, out.attempt, out.hop,
                absl::StatusCode::kDeadlineExceeded, "no acknowledgement");
    }
    if (o_.stage != 0) return;
    std::vector<std::pair<uint64_t, std::string>> resend;
    // Hops that did not answer a finished probe, and the probed steps. They are acted on after
    // this loop: PeerGone re-sends (re-routes) steps, which rewrites the very routes this loop
    // walks — acting inside it reported (and declared dead) hops of the *new* route instead
    // of the silent one (campaign seed 198).
    std::set<std::pair<Lid, uint64_t>> silent;
    std::vector<uint64_t> probed;
    for (auto& [id, st] : steps_) {
      if (st.resend_at > 0 && st.resend_at <= now) {
        resend.emplace_back(id, "hop failed");
        continue;
      }
      if (st.probe_until > 0) {
        if (st.probe_until > now) continue;
        // The probe is over: a hop that did not answer is dead.
        for (const Hop& h : st.route) {
          if (!st.ponged.count(h.lid)) silent.emplace(h.lid, h.epoch);
        }
        probed.push_back(id);
        continue;
      }
      if (st.deadline <= now) {
        st.probe_until = now + o_.probe_timeout_ms;
        st.ponged.clear();
        for (const Hop& h : st.route) {
          uint64_t nonce = next_corr_++;
          pings_[nonce] = id;
          Send(h.signal, PingSignal{nonce, lid_, signals_->address()});
        }
      }
    }
    for (const auto& [lid, epoch] : silent) {
      PeerGone(lid, epoch, "no answer to a probe after a step timeout", false);
      Report(lid, epoch);
    }
    for (uint64_t id : probed) {
      // Not re-sent by PeerGone already (every hop answered: the step itself was lost).
      auto it = steps_.find(id);
      if (it != steps_.end() && it->second.probe_until > 0) resend.emplace_back(id, "step timeout");
    }
    for (auto& [id, why] : resend) Resend(id, why);
  }

  void Report(const Lid& lid, uint64_t epoch) {
    connex::MutexLock lock(&report_mu_);
    reports_.emplace_back(lid, epoch);
  }

  void ReportLoop() {
    while (true) {
      std::pair<Lid, uint64_t> next;
      {
        connex::MutexLock lock(&report_mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(report_mu_) {
          return report_stop_ || !reports_.empty();
        };
        report_mu_.Await(absl::Condition(&ready));
        if (report_stop_) return;
        next = reports_.front();
        reports_.pop_front();
      }
      absl::StatusOr<bool> r = dir_.ReportFailed(next.first, next.second, lid_.ToString());
      if (!r.ok()) {
        CONNEX_LOG_DEBUG("pp {}: report of {} failed: {}", lid_.ToString(), next.first.ToString(),
                         AsStd(r.status().message()));
      }
    }
  }

  void Schedule(int64_t now) {
    if (draining_) return;
    // Requests ready for their next step, grouped by route.
    std::map<std::string, std::vector<uint64_t>> ready;
    std::map<std::string, std::vector<Hop>> routes;
    std::optional<LiveHops> live;  // one directory lookup per stage for all ready requests
    for (auto& [id, q] : requests_) {
      if (q.step != 0) continue;
      if (!live) live = CollectLiveHops();
      bool valid = q.route.size() == o_.stages - 1;
      for (const Hop& h : q.route) valid &= Usable(h.lid, h.epoch);
      if (!valid || o_.stages == 1) {
        std::optional<std::vector<Hop>> route = BuildRoute(q.route, *live);
        if (route && q.route.size() == route->size()) {
          bool moved = false;
          for (size_t i = 0; i < route->size(); ++i) moved |= (*route)[i].lid != q.route[i].lid;
          if (moved) ++stats_.failovers;  // its next step goes to another replica
        }
        if (!route) {
          if (now - q.waiting_since > o_.route_wait_ms) {
            Post(std::function<void()>([this, id = id] {
              Finish(id, absl::UnavailableError(
                             StrCat("request ", id, ": no live replica of some stage for ",
                                    o_.route_wait_ms, " ms (", RouteProblem(), ")")));
            }));
          }
          continue;
        }
        q.route = *route;
      } else {
        // Keep the hops, refresh their epochs and addresses (a migration keeps the state).
        std::optional<std::vector<Hop>> fresh = BuildRoute(q.route, *live);
        if (fresh) q.route = *fresh;
      }
      for (const Hop& h : q.route) q.visited.insert(h.lid);
      std::string key = RouteKey(q.route);
      ready[key].push_back(id);
      routes[key] = q.route;
    }
    if (ready.empty()) return;
    std::map<std::string, int> inflight;
    for (const auto& [id, st] : steps_) ++inflight[RouteKey(st.route)];
    for (auto& [key, ids] : ready) {
      size_t next = 0;
      while (next < ids.size() && inflight[key] < o_.inflight) {
        size_t end = std::min(ids.size(), next + static_cast<size_t>(o_.max_batch));
        std::vector<uint64_t> batch(ids.begin() + next, ids.begin() + end);
        next = end;
        if (CreateStep(batch, routes[key])) ++inflight[key];
      }
    }
  }

  bool CreateStep(const std::vector<uint64_t>& ids, const std::vector<Hop>& route) {
    std::vector<int32_t> starts, counts, tokens;
    for (uint64_t id : ids) {
      Request& q = requests_[id];
      starts.push_back(static_cast<int32_t>(q.cached));
      counts.push_back(static_cast<int32_t>(q.tokens.size() - q.cached));
      tokens.insert(tokens.end(), q.tokens.begin() + q.cached, q.tokens.end());
    }
    TensorDict in;
    SetBatch(in, ids, starts, counts);
    in.Set(kTokens, Tensor::Of<int32_t>({static_cast<int64_t>(tokens.size())}, tokens));
    std::vector<uint64_t> missing = engine_.MissingRequests(in);
    if (!missing.empty()) {
      // This stage lost them (released): recompute from the prompt on the next round.
      for (uint64_t id : missing) requests_[id].cached = 0;
      return false;
    }
    absl::StatusOr<TensorDict> out = engine_.ExecuteStep(in);
    if (!out.ok()) {
      for (uint64_t id : ids) {
        Finish(id, Annotate(out.status(), StrCat("request ", id, ": stage 0")));
      }
      return false;
    }
    ++stats_.steps_executed;
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
      steps_[step_id] = std::move(st);
      ResultSignal r{step_id, 1, lid_, ids, std::vector<int32_t>(t.begin(), t.end())};
      On(r);
      return true;
    }
    Step st;
    st.ids = ids;
    st.remaining = std::set<uint64_t>(ids.begin(), ids.end());
    st.starts = starts;
    st.counts = counts;
    st.route = route;
    st.output = *std::move(out);
    for (uint64_t id : ids) {
      requests_[id].step = step_id;
      requests_[id].waiting_since = NowMs();
    }
    Step& placed = steps_[step_id] = std::move(st);
    SendStep(step_id, placed);
    return true;
  }

  // Configuration and collaborators.
  const StageNodeOptions o_;
  Engine& engine_;
  transport::TransferEnginePtr transfer_;
  std::unique_ptr<SignalTransport> signals_;
  std::vector<std::unique_ptr<SignalTransport>> retired_;
  directory::DirectoryClient& dir_;
  const Lid lid_;
  std::shared_ptr<std::atomic<uint64_t>> epoch_ = std::make_shared<std::atomic<uint64_t>>(0);
  uint64_t peer_sub_ = 0;
  uint64_t dir_sub_ = 0;

  // Loop-thread state.
  std::unique_ptr<SendRing> ring_;
  void* recv_buf_ = nullptr;
  void* check_buf_ = nullptr;
  uint64_t next_corr_ = 1;
  uint64_t next_step_ = 1;
  std::set<uint64_t> seen_corr_;
  std::deque<uint64_t> seen_order_;
  std::map<std::pair<Lid, uint64_t>, Executed> executed_;
  std::map<uint64_t, uint64_t> last_step_;  // request -> the last step executed for it here
  std::deque<std::pair<Lid, uint64_t>> executed_order_;
  std::map<uint64_t, Outgoing> outgoing_;
  std::deque<PendingSend> pending_;
  std::map<std::pair<Lid, uint64_t>, std::vector<std::string>> watched_;  // -> its addresses
  std::set<std::pair<Lid, uint64_t>> dead_;
  std::set<std::pair<Lid, uint64_t>> draining_peers_;
  std::map<uint64_t, Request> requests_;
  std::map<uint64_t, Step> steps_;
  std::map<uint64_t, uint64_t> pings_;  // nonce -> step
  bool draining_ = false;
  StageNodeStats stats_;

  std::thread loop_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> last_step_ms_{0};
  connex::Mutex queue_mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stopped_ ABSL_GUARDED_BY(queue_mu_) = false;
  mutable connex::Mutex stats_mu_;
  StageNodeStats stats_snapshot_ ABSL_GUARDED_BY(stats_mu_);
  connex::Mutex report_mu_;
  std::deque<std::pair<Lid, uint64_t>> reports_ ABSL_GUARDED_BY(report_mu_);
  bool report_stop_ ABSL_GUARDED_BY(report_mu_) = false;
  std::thread reporter_;
};

StageNode::StageNode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StageNode::~StageNode() { impl_->Stop(false, 0); }

absl::StatusOr<std::unique_ptr<StageNode>> StageNode::Start(
    StageNodeOptions options, Engine& engine, transport::TransferEnginePtr transfer,
    std::unique_ptr<SignalTransport> signals, directory::DirectoryClient& directory) {
  CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(options.model));
  auto impl = std::make_unique<Impl>(std::move(options), engine, std::move(transfer),
                                     std::move(signals), directory);
  CONNEX_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<StageNode>(new StageNode(std::move(impl)));
}

absl::Status StageNode::Submit(uint64_t request_id, std::vector<int32_t> prompt, int max_new_tokens,
                               Completion done, TokenCallback on_token) {
  return impl_->Submit(request_id, std::move(prompt), max_new_tokens, std::move(done),
                       std::move(on_token));
}
void StageNode::Stop(bool leave, int64_t drain_timeout_ms) { impl_->Stop(leave, drain_timeout_ms); }
absl::Status StageNode::Migrate(std::unique_ptr<SignalTransport> signals) {
  return impl_->Migrate(std::move(signals));
}
const Lid& StageNode::lid() const { return impl_->lid(); }
uint64_t StageNode::epoch() const { return impl_->epoch(); }
StageNodeStats StageNode::stats() const { return impl_->Stats(); }

}  // namespace connex::pp
