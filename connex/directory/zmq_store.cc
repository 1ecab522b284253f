// The embedded directory's store (internal/store.h): the connex-directory at `tcp://HOST:PORT`,
// reached with ZeroMQ — requests on a DEALER socket, events on a SUB socket, both owned by one
// loop thread. It keeps what is particular to that protocol: the HELLO, request ids and
// deadlines, the per-LID HEARTBEAT, and the per-scope bookkeeping that finds gaps in the
// published events (revisions, the directory's incarnation, ticks) and answers them with a
// fresh snapshot. The lease keeper, the view and delivery are the shared client's.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <thread>

#include "connex/base/clock.h"
#include "connex/base/codec.h"
#include "connex/base/curve_zmq.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/client.h"
#include "connex/directory/internal/store.h"

namespace connex::directory::internal {
namespace {

using ReplyCallback = std::function<void(absl::StatusOr<wire::Frame>)>;

// Turns a reply frame into the frame (OK) or the status it carries (ERROR).
absl::StatusOr<wire::Frame> CheckReply(absl::StatusOr<wire::Frame> frame) {
  if (!frame.ok()) return frame;
  if (frame->type == kError) return DecodeError(frame->body);
  if (frame->type != kOk) {
    return absl::InternalError(StrCat("directory replied with unknown type '", frame->type, "'"));
  }
  return frame;
}

// A copy of `status` sharing nothing with it, for another thread: a Status shared with the loop
// thread is freed there by a refcount TSan cannot see (libabsl is not instrumented), which it
// reports as a race with the caller reading it. Payloads (EndedByLeave's mark) are copied too.
absl::Status FreshStatus(const absl::Status& status) {
  absl::Status fresh(status.code(), std::string(status.message()));
  status.ForEachPayload([&fresh](absl::string_view url, const absl::Cord& payload) {
    fresh.SetPayload(url, absl::Cord(std::string(payload)));
  });
  return fresh;
}

class ZmqStore final : public DirectoryStore {
 public:
  ZmqStore(DirectoryClientOptions options, WatchSink* sink)
      : options_(std::move(options)),
        sink_(sink),
        clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
        context_(1) {}

  ~ZmqStore() override {
    stop_.store(true);
    Wake();
    if (thread_.joinable()) thread_.join();
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  absl::Status Start();

  int64_t lease_ttl_ms() const override { return lease_ttl_ms_; }
  int64_t advised_heartbeat_ms() const override { return advised_heartbeat_ms_; }

  // ---- transactions ----

  absl::StatusOr<Registry::JoinResult> Join(const Lid& lid,
                                            const std::vector<std::string>& addresses,
                                            const std::map<std::string, std::string>& metadata,
                                            const JoinAuth& auth) override {
    wire::MapBuilder body;
    body.Str("lid", lid.ToString()).StrList("addresses", addresses).StrMap("metadata", metadata);
    if (!auth.credential.empty()) body.Str("credential", auth.credential);
    if (auth.force) body.Bool("force", true).Str("admin", auth.admin_token);
    if (auth.exclusive) body.Bool("exclusive", true);
    CONNEX_ASSIGN_OR_RETURN(wire::Frame reply, Call(kJoin, body));
    Registry::JoinResult joined;
    CONNEX_ASSIGN_OR_RETURN(joined.epoch, reply.body.Uint("epoch"));
    CONNEX_ASSIGN_OR_RETURN(joined.credential, reply.body.Str("credential"));
    joined.changed = true;
    return joined;
  }

  absl::Status Leave(const Lid& lid, uint64_t epoch, const Caller& caller) override {
    wire::MapBuilder body;
    body.Str("lid", lid.ToString());
    if (epoch != 0) body.Uint("epoch", epoch);
    if (!caller.credential.empty()) body.Str("credential", caller.credential);
    if (!caller.admin_token.empty()) body.Str("admin", caller.admin_token);
    return Call(kLeave, body).status();
  }

  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch, const Caller& caller) override {
    wire::MapBuilder body;
    body.Str("lid", lid.ToString()).Uint("epoch", epoch).Str("reporter", caller.name);
    if (caller.member) {
      body.Str("member", caller.member->ToString())
          .Str("member_credential", caller.member_credential);
    }
    if (!caller.admin_token.empty()) body.Str("admin", caller.admin_token);
    CONNEX_ASSIGN_OR_RETURN(wire::Frame reply, Call(kReportFailed, body));
    return reply.body.Bool("evicted");
  }

  absl::StatusOr<Snapshot> GetSnapshot(std::optional<std::string> model,
                                       std::optional<uint32_t> group) override {
    wire::MapBuilder body;
    if (model) body.Str("model", *model);
    if (group) body.Uint("group", *group);
    CONNEX_ASSIGN_OR_RETURN(wire::Frame reply, Call(kSnapshot, body));
    return DecodeSnapshot(reply.body);
  }

  // ---- the lease: one HEARTBEAT per held LID, all in flight at once ----

  std::vector<absl::StatusOr<Renewal>> Renew(const std::vector<Held>& held,
                                             int64_t timeout_ms) override {
    std::vector<absl::StatusOr<Renewal>> out(held.size(), absl::UnknownError("not renewed"));
    if (absl::Status here = NotOnLoopThread(); !here.ok()) {
      for (auto& r : out) r = here;
      return out;
    }
    std::vector<std::future<absl::StatusOr<Renewal>>> replies;
    for (const Held& h : held) {
      auto promise = std::make_shared<std::promise<absl::StatusOr<Renewal>>>();
      replies.push_back(promise->get_future());
      wire::MapBuilder body;
      body.Str("lid", h.lid.ToString()).Uint("epoch", h.epoch).Str("credential", h.credential);
      Send(
          kHeartbeat, body,
          [promise, epoch = h.epoch](absl::StatusOr<wire::Frame> r) {
            if (!r.ok()) {
              promise->set_value(FreshStatus(r.status()));
              return;
            }
            Renewal renewal;
            absl::StatusOr<uint64_t> e = r->body.UintOr("epoch", epoch);
            renewal.epoch = e.ok() ? *e : epoch;
            absl::StatusOr<std::string> c = r->body.StrOr("credential", "");
            if (c.ok()) renewal.credential = *c;
            promise->set_value(std::move(renewal));
          },
          timeout_ms);
    }
    for (size_t i = 0; i < replies.size(); ++i) out[i] = replies[i].get();
    return out;
  }

  // Each LID has its own lease, renewed by its HEARTBEAT.
  std::optional<int64_t> LeaseLeftMs(int64_t renewal_age_ms) const override {
    return lease_ttl_ms_ - renewal_age_ms;
  }

  // ---- the watch ----
  absl::Status Watch(const std::string& model) override;
  uint64_t view_revision() const override {
    MutexLock lock(&mu_);
    uint64_t revision = 0;
    for (const auto& [name, scope] : scopes_) revision = std::max(revision, scope.revision);
    return revision;
  }
  uint64_t events_received() const override { return events_received_.load(); }
  void DropEventsForTest(int n) override { drop_events_.fetch_add(n); }
  const std::string& pub_address() const override { return pub_address_; }

 private:
  struct Outgoing {
    uint64_t id;
    std::string frame;
    ReplyCallback done;
    std::string type;
    int64_t timeout_ms;
  };
  struct Pending {
    int64_t deadline_ms;
    ReplyCallback done;
    std::string type;
    int64_t timeout_ms = 0;
  };
  // What one Watch keeps: "" every model, else one model.
  struct Scope {
    bool want_snapshot = true;
    bool in_flight = false;  // its SNAPSHOT request is out
    bool have_snapshot = false;
    bool live = false;             // a message of its topic came: the subscription is up
    int failures = 0;              // snapshots refused or lost in a row
    int64_t retry_at_ms = 0;       // after a failure: no new request before (backoff)
    uint64_t incarnation = 0;      // of the directory its snapshot came from
    uint64_t request = 0;          // the snapshot request in flight (a later one abandons it)
    uint64_t requested_under = 0;  // the directory incarnation of the last tick when it was asked
    uint64_t revision = 0;         // "": the directory's revision; else the model's latest event
    std::vector<std::pair<Event, uint64_t>> buffered;  // (event, its incarnation), to apply
  };

  void Wake() {
    if (wake_fd_ >= 0) {
      uint64_t one = 1;
      ssize_t n = write(wake_fd_, &one, sizeof(one));
      (void)n;
    }
  }
  // `timeout_ms` 0: the request timeout.
  void Send(std::string_view type, wire::MapBuilder& body, ReplyCallback done,
            int64_t timeout_ms = 0);
  // A blocking method must not run on the loop thread, which alone could answer it.
  absl::Status NotOnLoopThread() const {
    if (std::this_thread::get_id() != loop_thread_id_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "DirectoryClient: blocking call from a callback on the client's loop thread");
  }
  absl::StatusOr<wire::Frame> Call(std::string_view type, wire::MapBuilder& body);

  // The loop thread.
  void Run();
  void SendOutbox();
  void HandleReply(std::vector<zmq::message_t>& parts);
  void ExpirePending(int64_t now);
  void Resubscribe();
  void RequestSnapshot(const std::string& name);
  void InstallSnapshot(const std::string& name, Snapshot snapshot);
  void HandlePublished(std::vector<zmq::message_t>& parts);
  void HandleTick(const wire::MapView& body, uint64_t incarnation);
  void ApplyEvent(const std::string& name, Event event, uint64_t incarnation);

  const DirectoryClientOptions options_;
  WatchSink* const sink_;
  Clock* const clock_;  // options_.clock, or the real clock
  zmq::context_t context_;
  zmq::socket_t dealer_;  // loop thread (after Start)
  zmq::socket_t sub_;     // loop thread
  int wake_fd_ = -1;
  std::string pub_address_;
  int64_t lease_ttl_ms_ = 0;
  int64_t advised_heartbeat_ms_ = 1000;
  std::thread thread_;
  std::thread::id loop_thread_id_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> drop_events_{0};
  std::atomic<uint64_t> events_received_{0};

  std::map<uint64_t, Pending> pending_;  // loop thread only

  mutable Mutex mu_;
  std::deque<Outgoing> outbox_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Scope> scopes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> to_subscribe_ ABSL_GUARDED_BY(mu_);  // topics for the loop thread
  uint64_t tick_incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // the directory's, from its last tick
};

absl::Status ZmqStore::Start() {
  CONNEX_RETURN_IF_ERROR(ParseTcpEndpoint(options_.directory).status());
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  try {
    dealer_ = zmq::socket_t(context_, zmq::socket_type::dealer);
    ConfigureZmqSocket(dealer_, 64 << 20);
    MakeCurveClient(dealer_, options_.curve, options_.curve.directory_key);
    // Handshake failures (a CURVE key refused, CURVE on one side only) are seen by a monitor:
    // the HELLO then fails naming them instead of timing out.
    const std::string monitor_endpoint =
        StrCat("inproc://connex-directory-monitor-", reinterpret_cast<uintptr_t>(this));
    zmq_socket_monitor(dealer_.handle(), monitor_endpoint.c_str(),
                       ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    zmq::socket_t monitor(context_, zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(monitor_endpoint);
    struct StopMonitor {
      zmq::socket_t& dealer;
      ~StopMonitor() { zmq_socket_monitor(dealer.handle(), nullptr, 0); }
    } stop_monitor{dealer_};
    dealer_.connect(options_.directory);
    // HELLO on this thread, before the loop owns the socket.
    wire::MapBuilder body;
    body.Uint("id", 0);
    std::string frame = wire::EncodeFrame(kHello, body);
    dealer_.send(zmq::buffer(frame), zmq::send_flags::none);
    // Waited for in slices, so that the deadline follows the injected clock.
    zmq::pollitem_t items[] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                               {monitor.handle(), 0, ZMQ_POLLIN, 0}};
    const int64_t deadline_ms = clock_->NowMs() + options_.request_timeout_ms;
    for (int64_t now = clock_->NowMs(); now < deadline_ms && !(items[0].revents & ZMQ_POLLIN);
         now = clock_->NowMs()) {
      zmq::poll(items, 2, std::chrono::milliseconds(std::min<int64_t>(deadline_ms - now, 100)));
      if (items[1].revents & ZMQ_POLLIN) {
        zmq::message_t event, where;
        (void)monitor.recv(event, zmq::recv_flags::none);
        if (event.more()) (void)monitor.recv(where, zmq::recv_flags::none);
        uint16_t kind = 0;
        if (event.size() >= sizeof(kind)) std::memcpy(&kind, event.data(), sizeof(kind));
        return absl::PermissionDeniedError(StrCat(
            "directory ", options_.directory, ": the connection was refused in its handshake (",
            kind == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "our CURVE key is not authorized there"
            : options_.curve.enabled()
                ? "CURVE failed: is CONNEX_DIRECTORY_SERVER_KEY the directory's public key, "
                  "and does the directory use CURVE?"
                : "the directory requires CURVE: set CONNEX_CURVE_KEY_FILE",
            ")"));
      }
    }
    if (!(items[0].revents & ZMQ_POLLIN)) {
      return absl::UnavailableError(StrCat(
          "directory ", options_.directory, ": no answer within ", options_.request_timeout_ms,
          " ms (is connex-directory running there",
          options_.curve.enabled() ? ", with CURVE, and is CONNEX_DIRECTORY_SERVER_KEY its key?"
                                   : "?)"));
    }
    zmq::message_t reply;
    (void)dealer_.recv(reply, zmq::recv_flags::none);
    absl::StatusOr<wire::Frame> hello = CheckReply(wire::DecodeFrame(AsView(reply)));
    if (!hello.ok()) return Annotate(hello.status(), StrCat("directory ", options_.directory));
    CONNEX_ASSIGN_OR_RETURN(pub_address_, hello->body.Str("pub"));
    CONNEX_ASSIGN_OR_RETURN(lease_ttl_ms_, hello->body.Int("lease_ttl_ms"));
    CONNEX_ASSIGN_OR_RETURN(advised_heartbeat_ms_, hello->body.Int("heartbeat_ms"));
    if (options_.heartbeat_ms > 0) {
      absl::Status ok = ValidateLeaseSettings(lease_ttl_ms_, options_.heartbeat_ms);
      if (!ok.ok()) {
        return Annotate(ok, StrCat("directory ", options_.directory, " (its lease TTL)"));
      }
    }
    // A directory bound to a wildcard host is reached at the host we dialled.
    absl::StatusOr<TcpEndpoint> pub = ParseTcpEndpoint(pub_address_);
    if (!pub.ok()) return Annotate(pub.status(), "directory HELLO.pub");
    if (pub->host == "0.0.0.0" || pub->host == "*") {
      pub->host = ParseTcpEndpoint(options_.directory)->host;
      pub_address_ = pub->ToString();
    }
    sub_ = zmq::socket_t(context_, zmq::socket_type::sub);
    ConfigureZmqSocket(sub_, 64 << 20);
    MakeCurveClient(sub_, options_.curve, options_.curve.directory_key);
    sub_.set(zmq::sockopt::rcvhwm, kPubHighWaterMark);
    // Topics are subscribed to by Watch (a model's, or every model's).
    sub_.connect(pub_address_);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(StrCat("directory ", options_.directory, ": ", e.what()));
  }
  thread_ = std::thread([this] { Run(); });
  loop_thread_id_ = thread_.get_id();
  return absl::OkStatus();
}

void ZmqStore::Send(std::string_view type, wire::MapBuilder& body, ReplyCallback done,
                    int64_t timeout_ms) {
  uint64_t id = next_id_.fetch_add(1);
  body.Uint("id", id);
  if (!options_.token.empty()) body.Str("token", options_.token);
  Outgoing out{id, wire::EncodeFrame(type, body), std::move(done), std::string(type),
               timeout_ms > 0 ? timeout_ms : options_.request_timeout_ms};
  {
    MutexLock lock(&mu_);
    outbox_.push_back(std::move(out));
  }
  Wake();
}

absl::StatusOr<wire::Frame> ZmqStore::Call(std::string_view type, wire::MapBuilder& body) {
  CONNEX_RETURN_IF_ERROR(NotOnLoopThread());
  auto promise = std::make_shared<std::promise<absl::StatusOr<wire::Frame>>>();
  std::future<absl::StatusOr<wire::Frame>> future = promise->get_future();
  Send(type, body, [promise](absl::StatusOr<wire::Frame> r) { promise->set_value(std::move(r)); });
  return future.get();
}

// Watches `model` ("" = every model). A model's watcher subscribes to its topic only (and to
// the directory-wide tick), takes snapshots of that model only, and finds gaps by the model's
// own revisions (Event::model_previous, the model's ticks): other models' traffic never
// reaches it.
absl::Status ZmqStore::Watch(const std::string& model) {
  std::string key;
  {
    MutexLock lock(&mu_);
    if (scopes_.count("") == 0 && scopes_.count(model) == 0) {
      if (scopes_.empty() && !model.empty()) to_subscribe_.push_back(std::string(kTickTopic));
      if (model.empty()) {
        // Every model: one scope replaces the per-model ones (the view reports what its first
        // snapshot changes).
        scopes_.clear();
        to_subscribe_.push_back("");
        scopes_.emplace("", Scope{});
      } else {
        to_subscribe_.push_back(EventTopic(model));
        scopes_.emplace(model, Scope{});
      }
    }
    key = scopes_.count("") ? "" : model;
  }
  Wake();
  MutexLock lock(&mu_);
  // Ready once the snapshot is in and the subscription is live (a tick or event of its topic
  // came): events published before the SUB connection is up are otherwise lost to a slow
  // joiner until the next tick shows the gap.
  auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_.load()) return true;
    auto it = scopes_.find(key);
    if (it == scopes_.end()) it = scopes_.find("");  // replaced by a watch of every model
    return it != scopes_.end() && it->second.have_snapshot && it->second.live;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready),
                            absl::Milliseconds(options_.request_timeout_ms * 2))) {
    return absl::DeadlineExceededError(
        StrCat("directory ", options_.directory, ": no snapshot of ",
               key.empty() ? std::string("every model") : StrCat("model '", key, "'"), " within ",
               options_.request_timeout_ms * 2, " ms"));
  }
  return absl::OkStatus();
}

void ZmqStore::Run() {
  std::vector<zmq::message_t> parts;
  while (!stop_.load()) {
    int64_t now = clock_->NowMs();
    int64_t timeout = 100;
    for (const auto& [id, p] : pending_) timeout = std::min(timeout, p.deadline_ms - now);
    timeout = std::max<int64_t>(0, timeout);
    zmq::pollitem_t items[] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                               {sub_.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 3, std::chrono::milliseconds(timeout));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      CONNEX_LOG_ERROR("directory client: poll failed: {}", e.what());
      break;
    }
    if (items[2].revents & ZMQ_POLLIN) {
      uint64_t counter;
      ssize_t n = read(wake_fd_, &counter, sizeof(counter));
      (void)n;
    }
    SendOutbox();
    Resubscribe();
    while (true) {
      absl::StatusOr<bool> got = RecvMultipart(dealer_, &parts);
      if (!got.ok() || !*got) break;
      HandleReply(parts);
    }
    while (true) {
      absl::StatusOr<bool> got = RecvMultipart(sub_, &parts);
      if (!got.ok() || !*got) break;
      HandlePublished(parts);
    }
    now = clock_->NowMs();
    ExpirePending(now);
    std::vector<std::string> wanted;
    {
      MutexLock lock(&mu_);
      for (const auto& [name, scope] : scopes_) {
        if (scope.want_snapshot && !scope.in_flight && now >= scope.retry_at_ms) {
          wanted.push_back(name);
        }
      }
    }
    for (const std::string& name : wanted) RequestSnapshot(name);
  }
  // Fail whatever is still waiting.
  {
    MutexLock lock(&mu_);
    for (Outgoing& o : outbox_)
      pending_.emplace(o.id, Pending{0, std::move(o.done), o.type, o.timeout_ms});
    outbox_.clear();
  }
  for (auto& [id, p] : pending_) p.done(absl::CancelledError("directory client is shutting down"));
  pending_.clear();
}

void ZmqStore::SendOutbox() {
  std::deque<Outgoing> batch;
  {
    MutexLock lock(&mu_);
    batch.swap(outbox_);
  }
  int64_t now = clock_->NowMs();
  for (Outgoing& o : batch) {
    try {
      zmq::send_result_t sent = dealer_.send(zmq::buffer(o.frame), zmq::send_flags::dontwait);
      if (!sent) {
        o.done(absl::UnavailableError(StrCat("directory ", options_.directory,
                                             ": request queue full, ", o.type, " not sent")));
        continue;
      }
    } catch (const zmq::error_t& e) {
      o.done(absl::UnavailableError(StrCat("directory ", options_.directory, ": ", e.what())));
      continue;
    }
    pending_.emplace(o.id, Pending{now + o.timeout_ms, std::move(o.done), o.type, o.timeout_ms});
  }
}

void ZmqStore::HandleReply(std::vector<zmq::message_t>& parts) {
  if (parts.size() != 1) return;
  absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(AsView(parts[0]));
  if (!frame.ok()) {
    CONNEX_LOG_WARN("directory client: undecodable reply: {}", frame.status().ToString());
    return;
  }
  absl::StatusOr<uint64_t> id = frame->body.Uint("id");
  if (!id.ok()) return;
  auto it = pending_.find(*id);
  if (it == pending_.end()) return;  // a reply after its deadline
  ReplyCallback done = std::move(it->second.done);
  pending_.erase(it);
  done(CheckReply(std::move(frame)));
}

void ZmqStore::ExpirePending(int64_t now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.deadline_ms <= now) {
      ReplyCallback done = std::move(it->second.done);
      std::string type = it->second.type;
      int64_t timeout_ms = it->second.timeout_ms;
      it = pending_.erase(it);
      done(absl::DeadlineExceededError(StrCat("directory ", options_.directory, ": no reply to ",
                                              type, " within ", timeout_ms, " ms")));
    } else {
      ++it;
    }
  }
}

// The topics Watch added, subscribed to on the loop thread (which owns the socket).
void ZmqStore::Resubscribe() {
  std::vector<std::string> topics;
  {
    MutexLock lock(&mu_);
    topics.swap(to_subscribe_);
  }
  for (const std::string& topic : topics) {
    try {
      sub_.set(zmq::sockopt::subscribe, topic);
    } catch (const zmq::error_t& e) {
      CONNEX_LOG_WARN("directory client: subscribing to '{}' failed: {}", topic, e.what());
    }
  }
}

// A fresh snapshot of scope `name` ("" = every model).
void ZmqStore::RequestSnapshot(const std::string& name) {
  uint64_t request = 0;
  {
    MutexLock lock(&mu_);
    auto it = scopes_.find(name);
    if (it == scopes_.end() || it->second.in_flight) return;
    it->second.in_flight = true;
    it->second.want_snapshot = false;
    request = ++it->second.request;
    it->second.requested_under = tick_incarnation_;
  }
  wire::MapBuilder body;
  if (!name.empty()) body.Str("model", name);
  Send(kSnapshot, body, [this, name, request](absl::StatusOr<wire::Frame> reply) {
    {
      MutexLock lock(&mu_);
      auto it = scopes_.find(name);
      if (it == scopes_.end() || it->second.request != request) return;  // abandoned
    }
    absl::StatusOr<Snapshot> snapshot =
        reply.ok() ? DecodeSnapshot(reply->body) : absl::StatusOr<Snapshot>(reply.status());
    if (!snapshot.ok()) {
      if (reply.ok()) {
        CONNEX_LOG_WARN("directory client: bad snapshot: {}", snapshot.status().ToString());
      } else {
        CONNEX_LOG_DEBUG("directory client: snapshot failed: {}", reply.status().ToString());
      }
      MutexLock lock(&mu_);
      auto it = scopes_.find(name);
      if (it != scopes_.end()) {
        // Retried with backoff (50 ms doubling to 1 s): a directory that refuses snapshots
        // under load (too many unread replies) is not asked again at once.
        Scope& sc = it->second;
        sc.in_flight = false;
        sc.want_snapshot = true;
        sc.retry_at_ms =
            clock_->NowMs() + std::min<int64_t>(1000, int64_t{50} << std::min(sc.failures, 5));
        ++sc.failures;
      }
      return;
    }
    {
      MutexLock lock(&mu_);
      auto it = scopes_.find(name);
      if (it != scopes_.end()) it->second.failures = 0;
    }
    InstallSnapshot(name, *std::move(snapshot));
  });
  SendOutbox();
}

void ZmqStore::InstallSnapshot(const std::string& name, Snapshot snapshot) {
  std::vector<std::pair<Event, uint64_t>> buffered;
  const uint64_t incarnation = snapshot.incarnation;
  {
    MutexLock lock(&mu_);
    auto scope = scopes_.find(name);
    if (scope == scopes_.end()) return;  // replaced by a watch of every model
    Scope& sc = scope->second;
    sc.in_flight = false;
    sc.incarnation = incarnation;
    sc.revision = name.empty() ? snapshot.revision : snapshot.model_revision;
    buffered.swap(sc.buffered);
    // Another directory incarnation: the other scopes' views are of the previous one.
    for (auto& [other, o] : scopes_) {
      if (o.have_snapshot && o.incarnation != incarnation) o.want_snapshot = true;
    }
  }
  sink_->OnSnapshot(name, std::move(snapshot));
  {
    // Only now: Watch returns once the view holds the snapshot.
    MutexLock lock(&mu_);
    auto scope = scopes_.find(name);
    if (scope != scopes_.end()) scope->second.have_snapshot = true;
  }
  // Events that arrived while the snapshot was in flight.
  std::sort(buffered.begin(), buffered.end(),
            [](const auto& a, const auto& b) { return a.first.revision < b.first.revision; });
  for (auto& [e, event_incarnation] : buffered) {
    if (event_incarnation == incarnation) ApplyEvent(name, std::move(e), event_incarnation);
  }
}

void ZmqStore::HandlePublished(std::vector<zmq::message_t>& parts) {
  if (parts.size() != 2) return;
  absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(AsView(parts[1]));
  if (!frame.ok()) {
    CONNEX_LOG_WARN("directory client: undecodable event: {}", frame.status().ToString());
    return;
  }
  absl::StatusOr<uint64_t> incarnation = frame->body.Uint("incarnation");
  if (!incarnation.ok()) return;
  if (frame->type == kTick) {
    HandleTick(frame->body, *incarnation);
    return;
  }
  if (frame->type != kEvent) return;
  events_received_.fetch_add(1);
  if (drop_events_.load() > 0) {
    drop_events_.fetch_sub(1);
    return;
  }
  absl::StatusOr<Event> event = DecodeEvent(frame->body);
  if (!event.ok()) {
    CONNEX_LOG_WARN("directory client: bad event: {}", event.status().ToString());
    return;
  }
  std::string name;
  {
    MutexLock lock(&mu_);
    name = scopes_.count("") ? "" : event->record.lid.model;
    auto it = scopes_.find(name);
    if (it == scopes_.end()) return;  // not a model this client watches
    Scope& sc = it->second;
    sc.live = true;
    if (!sc.have_snapshot || sc.in_flight) {
      sc.buffered.emplace_back(*std::move(event), *incarnation);
      return;
    }
  }
  ApplyEvent(name, *std::move(event), *incarnation);
}

// The directory-wide tick (`model` absent) shows a gap of the every-model scope and a restart
// of the directory (a new incarnation) to every scope; a model's tick shows a gap of that
// model's scope. Either makes the scope live (its subscription is up).
void ZmqStore::HandleTick(const wire::MapView& body, uint64_t incarnation) {
  absl::StatusOr<uint64_t> revision = body.Uint("revision");
  absl::StatusOr<std::string> model = body.StrOr("model", "");
  absl::StatusOr<uint64_t> model_revision = body.UintOr("model_revision", 0);
  if (!revision.ok() || !model.ok() || !model_revision.ok()) return;
  std::vector<std::string> stale;
  {
    MutexLock lock(&mu_);
    tick_incarnation_ = incarnation;
    for (auto& [name, sc] : scopes_) {
      // A snapshot asked of an earlier incarnation of the directory may never be answered (the
      // request died with it): abandoned for one asked of this one, at once rather than after
      // the request timeout, during which the watcher would be blind (campaign seed 33).
      if (sc.in_flight && sc.requested_under != 0 && sc.requested_under != incarnation) {
        CONNEX_LOG_DEBUG(
            "directory client: the directory restarted while the snapshot of '{}' "
            "was asked; asking again",
            name);
        sc.in_flight = false;
        ++sc.request;
        stale.push_back(name);
        continue;
      }
      uint64_t seen = 0;
      if (model->empty()) {
        if (name.empty()) sc.live = true;
        seen = name.empty() ? *revision : 0;
      } else {
        if (name != *model) continue;
        sc.live = true;
        seen = *model_revision;
      }
      if (!sc.have_snapshot || sc.in_flight) continue;
      if (incarnation != sc.incarnation || seen > sc.revision) {
        CONNEX_LOG_DEBUG("directory client: gap of '{}' (at {}, directory at {}); new snapshot",
                         name, sc.revision, seen);
        stale.push_back(name);
      }
    }
  }
  for (const std::string& name : stale) RequestSnapshot(name);
}

void ZmqStore::ApplyEvent(const std::string& name, Event event, uint64_t incarnation) {
  {
    MutexLock lock(&mu_);
    auto scope = scopes_.find(name);
    if (scope == scopes_.end()) return;
    Scope& sc = scope->second;
    if (event.revision <= sc.revision && incarnation == sc.incarnation) return;  // seen
    // Events of every model are numbered without gaps; a model's event names the revision of
    // the model's previous one.
    bool follows =
        name.empty() ? event.revision == sc.revision + 1 : event.model_previous <= sc.revision;
    if (incarnation != sc.incarnation || !follows) {
      sc.buffered.emplace_back(std::move(event), incarnation);
      sc.want_snapshot = true;
      return;
    }
    sc.revision = event.revision;
  }
  sink_->OnEvent(event);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DirectoryStore>> OpenZmqStore(const DirectoryClientOptions& options,
                                                             WatchSink* sink) {
  auto store = std::make_unique<ZmqStore>(options, sink);
  CONNEX_RETURN_IF_ERROR(store->Start());
  return store;
}

}  // namespace connex::directory::internal
