#include "connex/directory/client.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "connex/base/clock.h"
#include "connex/base/codec.h"
#include "connex/base/config.h"
#include "connex/base/curve_zmq.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/internal/client_backend.h"
#include "connex/directory/secret.h"

namespace connex::directory {

absl::StatusOr<DirectoryClientOptions> DirectoryClientOptions::FromEnv() {
  DirectoryClientOptions o;
  o.directory = EnvString("CONNEX_DIRECTORY", o.directory);
  CONNEX_ASSIGN_OR_RETURN(o.token, ClientTokenFromEnv());
  CONNEX_ASSIGN_OR_RETURN(o.admin_token, AdminTokenFromEnv());
  CONNEX_ASSIGN_OR_RETURN(o.heartbeat_ms, EnvInt("CONNEX_HEARTBEAT_MS", 0, 0, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.request_timeout_ms, EnvInt("CONNEX_DIRECTORY_TIMEOUT_MS",
                                                       o.request_timeout_ms, 1, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.curve, CurveSettings::FromEnv());
  return o;
}

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

}  // namespace

namespace {

// The embedded directory's client: ZeroMQ requests (DEALER) and events (SUB) on one loop thread.
class ZmqClientBackend final : public internal::ClientBackend {
 public:
  explicit ZmqClientBackend(DirectoryClientOptions options)
      : options_(std::move(options)),
        clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
        context_(1) {}

  ~ZmqClientBackend() {
    stop_.store(true);
    Wake();
    if (thread_.joinable()) thread_.join();
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  absl::Status Start() {
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
                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
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
      CONNEX_ASSIGN_OR_RETURN(int64_t advised, hello->body.Int("heartbeat_ms"));
      heartbeat_ms_ = options_.heartbeat_ms > 0 ? options_.heartbeat_ms : advised;
      if (heartbeat_ms_ <= 0) heartbeat_ms_ = 1000;
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

  // ---- requests from any thread ----

  // `timeout_ms` 0: the request timeout.
  void Send(std::string_view type, wire::MapBuilder& body, ReplyCallback done,
            int64_t timeout_ms = 0) {
    uint64_t id = next_id_.fetch_add(1);
    body.Uint("id", id);
    if (!options_.token.empty()) body.Str("token", options_.token);
    Outgoing out{id, wire::EncodeFrame(type, body), std::move(done), std::string(type),
                 timeout_ms > 0 ? timeout_ms : options_.request_timeout_ms};
    {
      connex::MutexLock lock(&mu_);
      outbox_.push_back(std::move(out));
    }
    Wake();
  }

  // A blocking method must not run on the loop thread, which alone could answer it.
  absl::Status NotOnLoopThread() const {
    if (std::this_thread::get_id() != loop_thread_id_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "DirectoryClient: blocking call from a callback on the client's loop thread");
  }

  absl::StatusOr<wire::Frame> Call(std::string_view type, wire::MapBuilder& body) {
    CONNEX_RETURN_IF_ERROR(NotOnLoopThread());
    auto promise = std::make_shared<std::promise<absl::StatusOr<wire::Frame>>>();
    std::future<absl::StatusOr<wire::Frame>> future = promise->get_future();
    Send(type, body,
         [promise](absl::StatusOr<wire::Frame> r) { promise->set_value(std::move(r)); });
    return future.get();
  }

  absl::StatusOr<uint64_t> Join(const Lid& lid, std::vector<std::string> addresses,
                                std::map<std::string, std::string> metadata, bool force) {
    CONNEX_RETURN_IF_ERROR(ValidateRegistration(addresses, metadata));
    if (force && options_.admin_token.empty()) {
      return absl::PermissionDeniedError(
          StrCat("a forced JOIN of ", lid.ToString(),
                 " needs the admin token (CONNEX_DIRECTORY_ADMIN_TOKEN or _FILE)"));
    }
    {
      connex::MutexLock lock(&mu_);
      ++joins_in_flight_[lid];
    }
    struct JoinDone {
      ZmqClientBackend* impl;
      const Lid& lid;
      ~JoinDone() {
        connex::MutexLock lock(&impl->mu_);
        if (--impl->joins_in_flight_[lid] == 0) impl->joins_in_flight_.erase(lid);
      }
    } join_done{this, lid};
    // A previous holder that died keeps the LID until its lease runs out: wait that long.
    const int64_t give_up_ms =
        clock_->NowMs() + (options_.join_waits_for_lease ? lease_ttl_ms_ + heartbeat_ms_ : 0);
    while (true) {
      wire::MapBuilder body;
      body.Str("lid", lid.ToString()).StrList("addresses", addresses).StrMap("metadata", metadata);
      {
        connex::MutexLock lock(&mu_);
        auto it = registrations_.find(lid);
        if (it != registrations_.end()) body.Str("credential", it->second.credential);
      }
      if (force) body.Bool("force", true).Str("admin", options_.admin_token);
      absl::StatusOr<wire::Frame> reply = Call(kJoin, body);
      int64_t now = clock_->NowMs();
      if (!reply.ok() && reply.status().code() == absl::StatusCode::kAlreadyExists &&
          now < give_up_ms) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min<int64_t>(give_up_ms - now, heartbeat_ms_)));
        continue;
      }
      if (!reply.ok()) return reply.status();
      CONNEX_ASSIGN_OR_RETURN(uint64_t epoch, reply->body.Uint("epoch"));
      CONNEX_ASSIGN_OR_RETURN(std::string credential, reply->body.Str("credential"));
      connex::MutexLock lock(&mu_);
      Registration& r = registrations_[lid];
      r.epoch = epoch;
      r.credential = std::move(credential);
      r.addresses = std::move(addresses);
      r.metadata = std::move(metadata);
      r.next_heartbeat_ms = now + heartbeat_ms_;
      r.renewed_ms = clock_->NowMs();
      // A heartbeat (or rejoin) of the previous epoch may still be in flight (a migration);
      // its reply is ignored as stale, so it must not hold the next heartbeats back.
      r.heartbeat_in_flight = false;
      r.rejoining = false;  // a rejoin of the previous epoch is stale now, as its heartbeats
      return epoch;
    }
  }

  absl::Status Leave(const Lid& lid) {
    uint64_t epoch = 0;
    std::string credential;
    {
      connex::MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it == registrations_.end()) {
        return absl::NotFoundError(StrCat("this client does not hold ", lid.ToString()));
      }
      epoch = it->second.epoch;
      credential = it->second.credential;
      registrations_.erase(it);  // stop heartbeating first
    }
    wire::MapBuilder body;
    body.Str("lid", lid.ToString()).Uint("epoch", epoch).Str("credential", credential);
    return Call(kLeave, body).status();
  }

  absl::Status LeaveAll() {
    std::vector<Lid> lids;
    {
      connex::MutexLock lock(&mu_);
      for (const auto& [lid, r] : registrations_) lids.push_back(lid);
    }
    absl::Status result;
    for (const Lid& lid : lids) result.Update(Leave(lid));
    return result;
  }

  absl::StatusOr<uint64_t> Renew(const Lid& lid) {
    CONNEX_RETURN_IF_ERROR(NotOnLoopThread());
    uint64_t epoch = 0;
    wire::MapBuilder body;
    {
      connex::MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it == registrations_.end()) {
        return absl::NotFoundError(StrCat("this client does not hold ", lid.ToString()));
      }
      epoch = it->second.epoch;
      body.Str("lid", lid.ToString()).Uint("epoch", epoch).Str("credential", it->second.credential);
    }
    auto promise = std::make_shared<std::promise<absl::StatusOr<uint64_t>>>();
    std::future<absl::StatusOr<uint64_t>> future = promise->get_future();
    SendHeartbeat(lid, epoch, body, /*scheduled=*/false, [promise](absl::StatusOr<uint64_t> held) {
      // A fresh Status for the caller's thread: one shared with this loop thread
      // is freed here by a refcount TSan cannot see (libabsl is not instrumented),
      // which it reports as a race with the caller reading the message.
      if (held.ok()) {
        promise->set_value(*held);
      } else {
        promise->set_value(
            absl::Status(held.status().code(), std::string(held.status().message())));
      }
    });
    absl::StatusOr<uint64_t> held = future.get();
    if (held.ok() || held.status().code() == absl::StatusCode::kDeadlineExceeded ||
        held.status().code() == absl::StatusCode::kUnavailable) {
      return held;
    }
    return absl::FailedPreconditionError(StrCat("directory: ", lid.ToString(), " epoch ", epoch,
                                                " is no longer held: ", held.status().message()));
  }

  std::optional<int64_t> RenewalAgeMs(const Lid& lid) const {
    connex::MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end() || it->second.renewed_ms == 0) return std::nullopt;
    return clock_->NowMs() - it->second.renewed_ms;
  }
  std::optional<int64_t> LeaseLeftMs(const Lid& lid) const {
    std::optional<int64_t> age = RenewalAgeMs(lid);
    if (!age) return std::nullopt;
    return lease_ttl_ms_ - *age;
  }
  int64_t heartbeat_ms() const { return heartbeat_ms_; }

  std::optional<uint64_t> EpochOf(const Lid& lid) const {
    connex::MutexLock lock(&mu_);
    auto it = registrations_.find(lid);
    if (it == registrations_.end()) return std::nullopt;
    return it->second.epoch;
  }

  void OnRegistrationChange(std::function<void(const RegistrationChange&)> cb) {
    connex::MutexLock lock(&mu_);
    registration_callbacks_.push_back(std::move(cb));
  }

  absl::StatusOr<Snapshot> GetSnapshot(std::optional<std::string> model,
                                       std::optional<uint32_t> group) {
    wire::MapBuilder body;
    if (model) body.Str("model", *model);
    if (group) body.Uint("group", *group);
    CONNEX_ASSIGN_OR_RETURN(wire::Frame reply, Call(kSnapshot, body));
    return DecodeSnapshot(reply.body);
  }

  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch, std::string_view reporter) {
    wire::MapBuilder body;
    body.Str("lid", lid.ToString()).Uint("epoch", epoch).Str("reporter", reporter);
    {
      // A member of the model vouches with the credential of a LID it holds there.
      connex::MutexLock lock(&mu_);
      for (const auto& [held, r] : registrations_) {
        if (held.model != lid.model || held == lid) continue;
        body.Str("member", held.ToString()).Str("member_credential", r.credential);
        break;
      }
    }
    if (!options_.admin_token.empty()) body.Str("admin", options_.admin_token);
    CONNEX_ASSIGN_OR_RETURN(wire::Frame reply, Call(kReportFailed, body));
    return reply.body.Bool("evicted");
  }

  absl::Status Evict(const Lid& lid) {
    wire::MapBuilder body;
    body.Str("lid", lid.ToString());
    if (!options_.admin_token.empty()) body.Str("admin", options_.admin_token);
    return Call(kLeave, body).status();
  }

  // Watches `model` ("" = every model). A model's watcher subscribes to its topic only (and to
  // the directory-wide tick), takes snapshots of that model only, and finds gaps by the model's
  // own revisions (Event::model_previous, the model's ticks): other models' traffic never
  // reaches it.
  absl::Status Watch(const std::string& model) {
    std::string key;
    {
      connex::MutexLock lock(&mu_);
      if (scopes_.count("") == 0 && scopes_.count(model) == 0) {
        if (scopes_.empty() && !model.empty()) to_subscribe_.push_back(std::string(kTickTopic));
        if (model.empty()) {
          // Every model: one scope replaces the per-model ones; its first snapshot reports what
          // differs from the records already in the view.
          scopes_.clear();
          to_subscribe_.push_back("");
          scopes_[""].synthesize = true;
        } else {
          to_subscribe_.push_back(EventTopic(model));
          scopes_.emplace(model, Scope{});
        }
      }
      key = scopes_.count("") ? "" : model;
    }
    Wake();
    connex::MutexLock lock(&mu_);
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

  std::vector<Record> View(std::string_view model, std::optional<uint32_t> group) const {
    connex::MutexLock lock(&mu_);
    return FilterView(model, group);
  }

  bool AwaitView(std::string_view model,
                 const std::function<bool(const std::vector<Record>&)>& predicate,
                 int64_t timeout_ms) const {
    connex::MutexLock lock(&mu_);
    auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return predicate(FilterView(model, std::nullopt));
    };
    // Waited for in slices, so that the deadline follows the injected clock.
    const int64_t deadline_ms = clock_->NowMs() + timeout_ms;
    while (true) {
      int64_t left = deadline_ms - clock_->NowMs();
      if (left <= 0) return holds();
      if (mu_.AwaitWithTimeout(absl::Condition(&holds),
                               absl::Milliseconds(std::min<int64_t>(left, 50)))) {
        return true;
      }
    }
  }

  uint64_t Subscribe(std::function<void(const Event&)> cb) {
    connex::MutexLock lock(&mu_);
    uint64_t id = next_subscriber_++;
    subscribers_.emplace(id, std::make_shared<std::function<void(const Event&)>>(std::move(cb)));
    return id;
  }

  // After this returns the callback is not running and is never called again (unless called
  // from a callback, on the loop thread, where the delivery in progress is the caller's own).
  void Unsubscribe(uint64_t id) {
    {
      connex::MutexLock lock(&mu_);
      subscribers_.erase(id);
    }
    if (std::this_thread::get_id() != loop_thread_id_) {
      std::lock_guard<std::mutex> wait(deliver_mu_);
    }
  }

  uint64_t view_revision() const {
    connex::MutexLock lock(&mu_);
    uint64_t revision = 0;
    for (const auto& [name, scope] : scopes_) revision = std::max(revision, scope.revision);
    return revision;
  }
  uint64_t resnapshots() const {
    connex::MutexLock lock(&mu_);
    return resnapshots_;
  }
  uint64_t events_received() const { return events_received_.load(); }
  const std::string& pub_address() const { return pub_address_; }
  const std::string& directory_address() const { return options_.directory; }
  int64_t lease_ttl_ms() const { return lease_ttl_ms_; }
  void DropEventsForTest(int n) { drop_events_.fetch_add(n); }
  void DelayEventsForTest(int ms) { delay_events_ms_.store(ms); }

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
  struct Registration {
    uint64_t epoch = 0;
    std::string credential;  // of `epoch`; never leaves this client except to the directory
    std::vector<std::string> addresses;
    std::map<std::string, std::string> metadata;
    int64_t next_heartbeat_ms = 0;
    bool heartbeat_in_flight = false;
    bool rejoining = false;  // a rejoin's JOIN is in flight: no second one
    int64_t renewed_ms = 0;  // when the directory last confirmed `epoch` (JOIN or heartbeat)
  };

  void Wake() {
    if (wake_fd_ >= 0) {
      uint64_t one = 1;
      ssize_t n = write(wake_fd_, &one, sizeof(one));
      (void)n;
    }
  }

  std::vector<Record> FilterView(std::string_view model, std::optional<uint32_t> group) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Record> out;
    for (const auto& [lid, record] : view_) {
      if (!model.empty() && lid.model != model) continue;
      if (group && lid.group != *group) continue;
      out.push_back(record);
    }
    return out;
  }

  // ---- the loop thread ----

  void Run() {
    std::vector<zmq::message_t> parts;
    while (!stop_.load()) {
      int64_t now = clock_->NowMs();
      int64_t timeout = 100;
      for (const auto& [id, p] : pending_) timeout = std::min(timeout, p.deadline_ms - now);
      {
        connex::MutexLock lock(&mu_);
        for (const auto& [lid, r] : registrations_) {
          if (!r.heartbeat_in_flight) timeout = std::min(timeout, r.next_heartbeat_ms - now);
        }
      }
      if (!delayed_.empty()) timeout = std::min(timeout, delayed_.front().first - now);
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
      DeliverDue(now);
      ExpirePending(now);
      SendHeartbeats(now);
      std::vector<std::string> wanted;
      {
        connex::MutexLock lock(&mu_);
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
      connex::MutexLock lock(&mu_);
      for (Outgoing& o : outbox_)
        pending_.emplace(o.id, Pending{0, std::move(o.done), o.type, o.timeout_ms});
      outbox_.clear();
    }
    for (auto& [id, p] : pending_)
      p.done(absl::CancelledError("directory client is shutting down"));
    pending_.clear();
  }

  void SendOutbox() {
    std::deque<Outgoing> batch;
    {
      connex::MutexLock lock(&mu_);
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

  void HandleReply(std::vector<zmq::message_t>& parts) {
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

  void ExpirePending(int64_t now) {
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

  void SendHeartbeats(int64_t now) {
    struct Due {
      Lid lid;
      uint64_t epoch;
      std::string credential;
    };
    std::vector<Due> due;
    {
      connex::MutexLock lock(&mu_);
      for (auto& [lid, r] : registrations_) {
        if (r.heartbeat_in_flight || r.next_heartbeat_ms > now) continue;
        r.heartbeat_in_flight = true;
        r.next_heartbeat_ms = now + heartbeat_ms_;
        due.push_back(Due{lid, r.epoch, r.credential});
      }
    }
    for (const Due& d : due) {
      wire::MapBuilder body;
      body.Str("lid", d.lid.ToString()).Uint("epoch", d.epoch).Str("credential", d.credential);
      SendHeartbeat(d.lid, d.epoch, body, /*scheduled=*/true, nullptr);
    }
    if (!due.empty()) SendOutbox();
  }

  // One heartbeat of (lid, epoch); `done` (if any) gets the epoch held or the refusal. Only a
  // `scheduled` one holds the next ones back while it is in flight.
  void SendHeartbeat(const Lid& lid, uint64_t epoch, wire::MapBuilder& body, bool scheduled,
                     std::function<void(absl::StatusOr<uint64_t>)> done) {
    Send(
        kHeartbeat, body,
        [this, lid, epoch, scheduled, done = std::move(done)](absl::StatusOr<wire::Frame> r) {
          uint64_t held = epoch;
          std::string credential;
          if (r.ok()) {
            absl::StatusOr<uint64_t> e = r->body.UintOr("epoch", epoch);
            if (e.ok()) held = *e;
            absl::StatusOr<std::string> c = r->body.StrOr("credential", "");
            if (c.ok()) credential = *c;
          }
          OnHeartbeatReply(lid, epoch, r.status(), held, credential, scheduled);
          if (done) done(r.ok() ? absl::StatusOr<uint64_t>(held) : r.status());
        },
        // A heartbeat lost with a dead connection (a directory restart) must not hold the
        // next ones back for a whole request timeout, which may exceed the lease.
        std::min(options_.request_timeout_ms, std::max<int64_t>(heartbeat_ms_, 50)));
  }

  void OnHeartbeatReply(const Lid& lid, uint64_t epoch, const absl::Status& status, uint64_t held,
                        std::string credential, bool scheduled) {
    {
      connex::MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it == registrations_.end() || it->second.epoch != epoch) return;  // left or migrated
      if (it->second.rejoining) return;  // the rejoin's JOIN decides (and re-arms heartbeats)
      if (scheduled) it->second.heartbeat_in_flight = false;
      if (status.ok() && held == epoch) it->second.renewed_ms = clock_->NowMs();
      if (status.ok() && held != epoch && !credential.empty()) {
        // A JOIN of ours was applied but its reply was lost: the directory knows better.
        it->second.epoch = held;
        it->second.credential = std::move(credential);
      } else if (status.ok() || status.code() == absl::StatusCode::kDeadlineExceeded ||
                 status.code() == absl::StatusCode::kUnavailable || joins_in_flight_.count(lid)) {
        return;  // renewed, the directory is unreachable, or a Join of ours decides: keep on
      }
    }
    if (status.ok()) {
      if (held != epoch) Notify(RegistrationChange{lid, epoch, held, absl::OkStatus()});
      return;
    }
    if (status.code() == absl::StatusCode::kNotFound && options_.rejoin_after_eviction) {
      CONNEX_LOG_WARN("directory client: {} epoch {}: heartbeat refused ({}); joining again",
                      lid.ToString(), epoch, AsStd(status.message()));
      Rejoin(lid, epoch);
      return;
    }
    CONNEX_LOG_WARN("directory client: {} epoch {}: heartbeat refused ({}); giving the LID up",
                    lid.ToString(), epoch, AsStd(status.message()));
    {
      connex::MutexLock lock(&mu_);
      registrations_.erase(lid);
    }
    RegistrationChange gone{lid, epoch, 0,
                            status.code() == absl::StatusCode::kNotFound
                                ? absl::FailedPreconditionError(status.message())
                                : status};
    gone.left = EndedByLeave(status);
    Notify(gone);
  }

  void Rejoin(const Lid& lid, uint64_t old_epoch) {
    wire::MapBuilder body;
    {
      connex::MutexLock lock(&mu_);
      auto it = registrations_.find(lid);
      if (it == registrations_.end() || it->second.rejoining) return;
      it->second.heartbeat_in_flight = true;  // no heartbeats until the JOIN is answered
      it->second.rejoining = true;
      body.Str("lid", lid.ToString())
          .StrList("addresses", it->second.addresses)
          .StrMap("metadata", it->second.metadata)
          .Str("credential", it->second.credential)
          .Bool("exclusive", true);
    }
    Send(kJoin, body, [this, lid, old_epoch](absl::StatusOr<wire::Frame> reply) {
      absl::StatusOr<uint64_t> epoch =
          reply.ok() ? reply->body.Uint("epoch") : absl::StatusOr<uint64_t>(reply.status());
      absl::StatusOr<std::string> credential =
          reply.ok() ? reply->body.Str("credential") : absl::StatusOr<std::string>("");
      if (epoch.ok() && !credential.ok()) epoch = credential.status();
      bool retry_later =
          !epoch.ok() && (epoch.status().code() == absl::StatusCode::kDeadlineExceeded ||
                          epoch.status().code() == absl::StatusCode::kUnavailable);
      {
        connex::MutexLock lock(&mu_);
        auto it = registrations_.find(lid);
        if (it == registrations_.end() || it->second.epoch != old_epoch) return;
        it->second.rejoining = false;
        if (epoch.ok()) {
          it->second.epoch = *epoch;
          it->second.credential = *std::move(credential);
          it->second.heartbeat_in_flight = false;
          it->second.next_heartbeat_ms = clock_->NowMs() + heartbeat_ms_;
          it->second.renewed_ms = clock_->NowMs();
        } else if (retry_later || joins_in_flight_.count(lid)) {
          // Unreachable: the next heartbeat tells us again. A Join of ours in flight (a
          // migration) took the LID first, or will report why it could not.
          it->second.heartbeat_in_flight = false;
          return;
        } else {
          registrations_.erase(it);
        }
      }
      if (epoch.ok()) {
        CONNEX_LOG_INFO("directory client: {} rejoined: epoch {} -> {}", lid.ToString(), old_epoch,
                        *epoch);
        Notify(RegistrationChange{lid, old_epoch, *epoch, absl::OkStatus()});
      } else {
        Notify(RegistrationChange{lid, old_epoch, 0, epoch.status()});
      }
    });
    SendOutbox();
  }

  void Notify(const RegistrationChange& change) {
    std::vector<std::function<void(const RegistrationChange&)>> callbacks;
    {
      connex::MutexLock lock(&mu_);
      callbacks = registration_callbacks_;
    }
    for (auto& cb : callbacks) cb(change);
  }

  // ---- the view ----

  // The topics Watch added, subscribed to on the loop thread (which owns the socket).
  void Resubscribe() {
    std::vector<std::string> topics;
    {
      connex::MutexLock lock(&mu_);
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
  void RequestSnapshot(const std::string& name) {
    uint64_t request = 0;
    {
      connex::MutexLock lock(&mu_);
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
        connex::MutexLock lock(&mu_);
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
        connex::MutexLock lock(&mu_);
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
        connex::MutexLock lock(&mu_);
        auto it = scopes_.find(name);
        if (it != scopes_.end()) it->second.failures = 0;
      }
      InstallSnapshot(name, *std::move(snapshot));
    });
    SendOutbox();
  }

  void InstallSnapshot(const std::string& name, Snapshot snapshot) {
    std::vector<Event> synthesized;
    std::vector<std::pair<Event, uint64_t>> buffered;
    {
      connex::MutexLock lock(&mu_);
      auto scope = scopes_.find(name);
      if (scope == scopes_.end()) return;  // replaced by a watch of every model
      Scope& sc = scope->second;
      sc.in_flight = false;
      auto in_scope = [&name](const Lid& lid) { return name.empty() || lid.model == name; };
      std::map<Lid, Record> fresh;
      for (Record& r : snapshot.records) {
        if (in_scope(r.lid)) fresh.emplace(r.lid, std::move(r));
      }
      if (sc.have_snapshot || sc.synthesize) {
        // What changed while we were not looking, as events.
        synthesized = EventsBetweenViews(view_, fresh, snapshot.revision, in_scope);
        if (sc.have_snapshot) ++resnapshots_;
      }
      for (auto it = view_.begin(); it != view_.end();) {
        it = in_scope(it->first) ? view_.erase(it) : std::next(it);
      }
      view_.merge(fresh);
      sc.synthesize = false;
      sc.incarnation = snapshot.incarnation;
      sc.revision = name.empty() ? snapshot.revision : snapshot.model_revision;
      sc.have_snapshot = true;
      buffered.swap(sc.buffered);
      // Another directory incarnation: the other scopes' views are of the previous one.
      for (auto& [other, o] : scopes_) {
        if (o.have_snapshot && o.incarnation != snapshot.incarnation) o.want_snapshot = true;
      }
    }
    Deliver(synthesized);
    // Events that arrived while the snapshot was in flight.
    std::sort(buffered.begin(), buffered.end(),
              [](const auto& a, const auto& b) { return a.first.revision < b.first.revision; });
    for (auto& [e, incarnation] : buffered) {
      if (incarnation == snapshot.incarnation) ApplyEvent(name, std::move(e), incarnation);
    }
  }

  void HandlePublished(std::vector<zmq::message_t>& parts) {
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
      connex::MutexLock lock(&mu_);
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
  void HandleTick(const wire::MapView& body, uint64_t incarnation) {
    absl::StatusOr<uint64_t> revision = body.Uint("revision");
    absl::StatusOr<std::string> model = body.StrOr("model", "");
    absl::StatusOr<uint64_t> model_revision = body.UintOr("model_revision", 0);
    if (!revision.ok() || !model.ok() || !model_revision.ok()) return;
    std::vector<std::string> stale;
    {
      connex::MutexLock lock(&mu_);
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

  void ApplyEvent(const std::string& name, Event event, uint64_t incarnation) {
    {
      connex::MutexLock lock(&mu_);
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
      const Lid& lid = event.record.lid;
      switch (event.kind) {
        case EventKind::kJoined:
        case EventKind::kMigrated:
          view_[lid] = event.record;
          break;
        case EventKind::kLeft:
        case EventKind::kFailed: {
          auto it = view_.find(lid);
          if (it != view_.end() && it->second.epoch == event.record.epoch) view_.erase(it);
          break;
        }
      }
    }
    Deliver({event});
  }

  void Deliver(const std::vector<Event>& events) {
    if (events.empty()) return;
    if (int delay = delay_events_ms_.load(); delay > 0 || !delayed_.empty()) {
      // Held back (in order) and delivered by the loop when due; heartbeats carry on.
      delayed_.emplace_back(clock_->NowMs() + delay, events);
      return;
    }
    DeliverNow(events);
  }

  // An event that evicts an epoch this client holds (a sender's report, an operator's drain, or
  // a fresh snapshot without it): its heartbeat is due now, so that the refusal starts the
  // rejoin at once rather than a heartbeat interval later.
  void HeartbeatNowIfEvicted(const std::vector<Event>& events) {
    connex::MutexLock lock(&mu_);
    for (const Event& e : events) {
      if (e.kind != EventKind::kFailed && e.kind != EventKind::kLeft) continue;
      auto it = registrations_.find(e.record.lid);
      if (it == registrations_.end() || it->second.epoch != e.record.epoch) continue;
      if (it->second.heartbeat_in_flight || it->second.rejoining) continue;
      CONNEX_LOG_INFO("directory client: {} epoch {} {}: heartbeat now", e.record.lid.ToString(),
                      e.record.epoch, EventKindName(e.kind));
      it->second.next_heartbeat_ms = 0;
    }
  }

  void DeliverDue(int64_t now) {
    while (!delayed_.empty() && delayed_.front().first <= now) {
      std::vector<Event> events = std::move(delayed_.front().second);
      delayed_.pop_front();
      DeliverNow(events);
    }
  }

  void DeliverNow(const std::vector<Event>& events) {
    HeartbeatNowIfEvicted(events);
    std::lock_guard<std::mutex> delivering(deliver_mu_);
    for (const Event& e : events) {
      // Looked up per event: a callback unsubscribed by an earlier one is not called again.
      std::vector<std::shared_ptr<std::function<void(const Event&)>>> callbacks;
      {
        connex::MutexLock lock(&mu_);
        for (const auto& [id, cb] : subscribers_) callbacks.push_back(cb);
      }
      for (auto& cb : callbacks) (*cb)(e);
    }
  }

  DirectoryClientOptions options_;
  Clock* const clock_;  // options_.clock, or the real clock
  zmq::context_t context_;
  zmq::socket_t dealer_;  // loop thread (after Start)
  zmq::socket_t sub_;     // loop thread
  int wake_fd_ = -1;
  std::string pub_address_;
  int64_t lease_ttl_ms_ = 0;
  int64_t heartbeat_ms_ = 1000;
  std::thread thread_;
  std::thread::id loop_thread_id_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> drop_events_{0};
  std::atomic<uint64_t> events_received_{0};
  std::atomic<int> delay_events_ms_{0};
  std::mutex deliver_mu_;  // held while subscribers run (loop thread), so Unsubscribe can wait

  // Loop thread only.
  std::map<uint64_t, Pending> pending_;
  std::deque<std::pair<int64_t, std::vector<Event>>> delayed_;  // (due ms, events)

  mutable connex::Mutex mu_;
  std::deque<Outgoing> outbox_ ABSL_GUARDED_BY(mu_);
  std::map<Lid, Registration> registrations_ ABSL_GUARDED_BY(mu_);
  // Join calls (a migration) in flight per LID: while one is, a refused heartbeat or a failed
  // rejoin does not give the LID up — the Join's own outcome decides (a rejoin that lost the
  // race to our own migration's JOIN told the node it had lost a LID it held).
  std::map<Lid, int> joins_in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(const RegistrationChange&)>> registration_callbacks_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<std::function<void(const Event&)>>> subscribers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_subscriber_ ABSL_GUARDED_BY(mu_) = 1;
  // What one Watch keeps: "" every model, else one model.
  struct Scope {
    bool want_snapshot = true;
    bool in_flight = false;  // its SNAPSHOT request is out
    bool have_snapshot = false;
    bool synthesize = false;       // its first snapshot reports differences (it replaced scopes)
    bool live = false;             // a message of its topic came: the subscription is up
    int failures = 0;              // snapshots refused or lost in a row
    int64_t retry_at_ms = 0;       // after a failure: no new request before (backoff)
    uint64_t incarnation = 0;      // of the directory its snapshot came from
    uint64_t request = 0;          // the snapshot request in flight (a later one abandons it)
    uint64_t requested_under = 0;  // the directory incarnation of the last tick when it was asked
    uint64_t revision = 0;         // "": the directory's revision; else the model's latest event
    std::vector<std::pair<Event, uint64_t>> buffered;  // (event, its incarnation), to apply
  };
  std::map<std::string, Scope> scopes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> to_subscribe_ ABSL_GUARDED_BY(mu_);  // topics for the loop thread
  std::map<Lid, Record> view_ ABSL_GUARDED_BY(mu_);
  uint64_t resnapshots_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tick_incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // the directory's, from its last tick
};

}  // namespace

DirectoryClient::DirectoryClient(std::unique_ptr<internal::ClientBackend> impl)
    : impl_(std::move(impl)) {}
DirectoryClient::~DirectoryClient() = default;

absl::StatusOr<std::unique_ptr<DirectoryClient>> DirectoryClient::Connect(
    DirectoryClientOptions options) {
  if (options.directory.rfind("etcd://", 0) == 0) {
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<internal::ClientBackend> etcd,
                            internal::ConnectEtcd(options));
    return std::unique_ptr<DirectoryClient>(new DirectoryClient(std::move(etcd)));
  }
  auto impl = std::make_unique<ZmqClientBackend>(std::move(options));
  CONNEX_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<DirectoryClient>(new DirectoryClient(std::move(impl)));
}

absl::StatusOr<uint64_t> DirectoryClient::Join(const Lid& lid, std::vector<std::string> addresses,
                                               std::map<std::string, std::string> metadata) {
  return impl_->Join(lid, std::move(addresses), std::move(metadata), /*force=*/false);
}
absl::StatusOr<uint64_t> DirectoryClient::ForceJoin(const Lid& lid,
                                                    std::vector<std::string> addresses,
                                                    std::map<std::string, std::string> metadata) {
  return impl_->Join(lid, std::move(addresses), std::move(metadata), /*force=*/true);
}
absl::Status DirectoryClient::Leave(const Lid& lid) { return impl_->Leave(lid); }
absl::Status DirectoryClient::LeaveAll() { return impl_->LeaveAll(); }
absl::StatusOr<uint64_t> DirectoryClient::Renew(const Lid& lid) { return impl_->Renew(lid); }
std::optional<uint64_t> DirectoryClient::EpochOf(const Lid& lid) const {
  return impl_->EpochOf(lid);
}
void DirectoryClient::OnRegistrationChange(std::function<void(const RegistrationChange&)> cb) {
  impl_->OnRegistrationChange(std::move(cb));
}
absl::StatusOr<Snapshot> DirectoryClient::GetSnapshot(std::optional<std::string> model,
                                                      std::optional<uint32_t> group) {
  return impl_->GetSnapshot(std::move(model), group);
}
absl::StatusOr<bool> DirectoryClient::ReportFailed(const Lid& lid, uint64_t epoch,
                                                   std::string_view reporter) {
  return impl_->ReportFailed(lid, epoch, reporter);
}
absl::Status DirectoryClient::Evict(const Lid& lid) { return impl_->Evict(lid); }
absl::Status DirectoryClient::Watch(std::string model) {
  if (!model.empty()) CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(model));
  return impl_->Watch(model);
}
std::vector<Record> DirectoryClient::View(std::string_view model,
                                          std::optional<uint32_t> group) const {
  return impl_->View(model, group);
}
uint64_t DirectoryClient::Subscribe(std::function<void(const Event&)> cb) {
  return impl_->Subscribe(std::move(cb));
}
void DirectoryClient::Unsubscribe(uint64_t id) { impl_->Unsubscribe(id); }
bool DirectoryClient::AwaitView(std::string_view model,
                                const std::function<bool(const std::vector<Record>&)>& predicate,
                                int64_t timeout_ms) const {
  return impl_->AwaitView(model, predicate, timeout_ms);
}
uint64_t DirectoryClient::view_revision() const { return impl_->view_revision(); }
uint64_t DirectoryClient::resnapshots() const { return impl_->resnapshots(); }
uint64_t DirectoryClient::events_received() const { return impl_->events_received(); }
const std::string& DirectoryClient::pub_address() const { return impl_->pub_address(); }
const std::string& DirectoryClient::directory_address() const { return impl_->directory_address(); }
int64_t DirectoryClient::lease_ttl_ms() const { return impl_->lease_ttl_ms(); }
int64_t DirectoryClient::heartbeat_ms() const { return impl_->heartbeat_ms(); }
std::optional<int64_t> DirectoryClient::RenewalAgeMs(const Lid& lid) const {
  return impl_->RenewalAgeMs(lid);
}
std::optional<int64_t> DirectoryClient::LeaseLeftMs(const Lid& lid) const {
  return impl_->LeaseLeftMs(lid);
}
void DirectoryClient::DropEventsForTest(int n) { impl_->DropEventsForTest(n); }
void DirectoryClient::DelayEventsForTest(int ms) { impl_->DelayEventsForTest(ms); }

}  // namespace connex::directory
