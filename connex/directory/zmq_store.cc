// The embedded directory's store: the connection, the requests and the renewals (the watch is
// zmq_watch.cc; the class is internal/zmq_store.h).
#include "connex/directory/internal/zmq_store.h"

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

}  // namespace

ZmqStore::~ZmqStore() {
  stop_.store(true);
  Wake();
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ZmqStore::Wake() {
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }
}

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

absl::StatusOr<Registry::JoinResult> ZmqStore::Join(
    const Lid& lid, const std::vector<std::string>& addresses,
    const std::map<std::string, std::string>& metadata, const JoinAuth& auth) {
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

absl::Status ZmqStore::Leave(const Lid& lid, uint64_t epoch, const Caller& caller) {
  wire::MapBuilder body;
  body.Str("lid", lid.ToString());
  if (epoch != 0) body.Uint("epoch", epoch);
  if (!caller.credential.empty()) body.Str("credential", caller.credential);
  if (!caller.admin_token.empty()) body.Str("admin", caller.admin_token);
  return Call(kLeave, body).status();
}

absl::StatusOr<bool> ZmqStore::ReportFailed(const Lid& lid, uint64_t epoch, const Caller& caller) {
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

absl::StatusOr<Snapshot> ZmqStore::GetSnapshot(std::optional<std::string> model,
                                               std::optional<uint32_t> group) {
  wire::MapBuilder body;
  if (model) body.Str("model", *model);
  if (group) body.Uint("group", *group);
  CONNEX_ASSIGN_OR_RETURN(wire::Frame reply, Call(kSnapshot, body));
  return DecodeSnapshot(reply.body);
}

std::vector<absl::StatusOr<Renewal>> ZmqStore::Renew(const std::vector<Held>& held,
                                                     int64_t timeout_ms) {
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

std::optional<int64_t> ZmqStore::LeaseLeftMs(int64_t renewal_age_ms) const {
  return lease_ttl_ms_ - renewal_age_ms;
}

absl::StatusOr<std::unique_ptr<DirectoryStore>> OpenZmqStore(const DirectoryClientOptions& options,
                                                             WatchSink* sink) {
  auto store = std::make_unique<ZmqStore>(options, sink);
  CONNEX_RETURN_IF_ERROR(store->Start());
  return store;
}

}  // namespace connex::directory::internal
