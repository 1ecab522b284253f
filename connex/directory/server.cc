#include "connex/directory/server.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "connex/base/codec.h"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/protocol.h"
#include "connex/directory/registry.h"
#include "connex/directory/secret.h"
#include "connex/directory/state_file.h"

namespace connex::directory {
namespace {

uint64_t WallClockMillis() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Bytes of replies handed to ZeroMQ and not yet sent (or dropped): libzmq frees a message's
// data once it has written it to the connection, or when the connection goes. Counted per
// connection and in total; the counters outlive the loop (libzmq may free a message after it).
struct Unread {
  std::atomic<int64_t> total{0};
};

struct ReplyData {
  std::string bytes;
  std::shared_ptr<Unread> unread;
  std::shared_ptr<std::atomic<int64_t>> connection;
  // Set (release) by the loop before libzmq takes the message, read (acquire) by FreeReply: the
  // hand-over inside libzmq is invisible to ThreadSanitizer, this edge is not.
  std::atomic<bool> handed_over{false};
};

// Runs on whichever thread libzmq releases the message on.
void FreeReply(void* /*data*/, void* hint) {
  std::unique_ptr<ReplyData> reply(static_cast<ReplyData*>(hint));
  (void)reply->handed_over.load(std::memory_order_acquire);
  const auto n = static_cast<int64_t>(reply->bytes.size());
  reply->unread->total.fetch_sub(n, std::memory_order_relaxed);
  reply->connection->fetch_sub(n, std::memory_order_relaxed);
}

std::string Mib(int64_t bytes) {
  return bytes >= (1 << 20) ? StrCat(bytes >> 20, " MiB") : StrCat(bytes >> 10, " KiB");
}

}  // namespace

absl::StatusOr<DirectoryServerOptions> DirectoryServerOptions::FromEnv() {
  DirectoryServerOptions o;
  o.bind = EnvString("CONNEX_DIRECTORY_BIND", o.bind);
  o.pub = EnvString("CONNEX_DIRECTORY_PUB", o.pub);
  CONNEX_ASSIGN_OR_RETURN(o.lease_ttl_ms,
                          EnvInt("CONNEX_LEASE_TTL_MS", o.lease_ttl_ms, 10, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(o.heartbeat_ms,
                          EnvInt("CONNEX_HEARTBEAT_MS", o.heartbeat_ms, 1, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.tick_ms, EnvInt("CONNEX_DIRECTORY_TICK_MS", o.tick_ms, 1, 60'000));
  CONNEX_ASSIGN_OR_RETURN(o.token, TokenFromEnv());
  o.state_dir = EnvString("CONNEX_DIRECTORY_STATE_DIR", "");
  int64_t limit = 0;
  CONNEX_ASSIGN_OR_RETURN(limit, EnvInt("CONNEX_DIRECTORY_MAX_RECORDS",
                                        static_cast<int64_t>(o.max_records), 1, 1 << 24));
  o.max_records = static_cast<size_t>(limit);
  CONNEX_ASSIGN_OR_RETURN(limit, EnvInt("CONNEX_DIRECTORY_MAX_RECORDS_PER_MODEL",
                                        static_cast<int64_t>(o.max_records_per_model), 1, 1 << 24));
  o.max_records_per_model = static_cast<size_t>(limit);
  CONNEX_ASSIGN_OR_RETURN(limit, EnvInt("CONNEX_DIRECTORY_MAX_RECORD_BYTES",
                                        static_cast<int64_t>(o.max_record_bytes), 256, 1 << 24));
  o.max_record_bytes = static_cast<size_t>(limit);
  CONNEX_ASSIGN_OR_RETURN(o.admin_token, AdminTokenFromEnv());
  CONNEX_ASSIGN_OR_RETURN(o.curve, CurveSettings::FromEnv());
  return o;
}

// Owned by the loop thread: the sockets, the registry and request handling.
class DirectoryServer::Loop {
 public:
  Loop(DirectoryServer* server, zmq::socket_t router, zmq::socket_t pub, uint64_t first_epoch,
       std::unique_ptr<StateFile> state, const std::optional<RegistryState>& saved)
      : server_(server),
        options_(server->options_),
        router_(std::move(router)),
        pub_(std::move(pub)),
        registry_(options_.clock, MakeRegistryOptions(options_, first_epoch)),
        state_(std::move(state)) {
    if (saved) {
      registry_.Restore(*saved);
      CONNEX_LOG_INFO("directory: restored {} records at revision {} from {} (next epoch {})",
                      registry_.size(), registry_.revision(), state_->path(),
                      registry_.next_epoch());
    }
  }

  // Writes the state file when the table or the epoch counter changed since the last write.
  // Called before replies and events go out, so nothing anyone saw is ever lost or handed out
  // again by a restart.
  absl::Status Persist() {
    if (state_ == nullptr) return absl::OkStatus();
    if (saved_ && registry_.next_epoch() == saved_next_epoch_ &&
        registry_.revision() == saved_revision_) {
      return absl::OkStatus();  // heartbeats and idempotent JOINs change neither
    }
    CONNEX_RETURN_IF_ERROR(state_->Save(registry_.Export()));
    saved_ = true;
    saved_next_epoch_ = registry_.next_epoch();
    saved_revision_ = registry_.revision();
    return absl::OkStatus();
  }

  static RegistryOptions MakeRegistryOptions(const DirectoryServerOptions& o,
                                             uint64_t first_epoch) {
    RegistryOptions r;
    r.lease_ttl_ms = o.lease_ttl_ms;
    r.first_epoch = first_epoch;
    r.admin_token = o.admin_token;
    r.max_records = o.max_records;
    r.max_records_per_model = o.max_records_per_model;
    r.max_record_bytes = o.max_record_bytes;
    return r;
  }

  void Run() {
    int64_t next_tick = options_.clock->NowMs();
    std::vector<zmq::message_t> parts;
    while (!server_->stop_.load()) {
      int64_t now = options_.clock->NowMs();
      int64_t timeout = std::min<int64_t>(50, std::max<int64_t>(0, next_tick - now));
      std::optional<int64_t> expiry = registry_.MsUntilNextExpiry();
      if (expiry) timeout = std::min(timeout, *expiry);
      if (!snapshots_.empty()) timeout = 0;
      zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 1, std::chrono::milliseconds(timeout));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        CONNEX_LOG_ERROR("directory: poll failed: {}", e.what());
        return;
      }
      // Drain every pending request before looking at leases.
      for (int i = 0; i < 1024; ++i) {
        absl::StatusOr<bool> got = RecvMultipart(router_, &parts);
        if (!got.ok() || !*got) break;
        HandleMessage(parts);
      }
      registry_.ExpireLeases();
      if (absl::Status saved = Persist(); !saved.ok()) {
        // Replying now could hand out an epoch that a restart hands out again. Stop: a restart
        // resumes from the last state written, and clients retry what got no reply.
        CONNEX_LOG_ERROR("directory: {}; stopping", AsStd(saved.message()));
        std::abort();
      }
      SendReplies();
      Publish();
      ServeSnapshots();
      now = options_.clock->NowMs();
      if (now >= next_tick) {
        PublishTick();
        next_tick = now + options_.tick_ms;
      }
      // After a storm of requests (connections come and go, each with ZeroMQ's buffers), glibc
      // keeps the freed memory: once a second, when more than kTrimFreeBytes of the heap are
      // free, give them back (a storm of 500 connections kept 14 MB without it).
      if (now - last_trim_check_ms_ >= kTrimCheckEveryMs) {
        last_trim_check_ms_ = now;
        if (mallinfo2().fordblks > kTrimFreeBytes) malloc_trim(0);
      }
    }
  }

 private:
  // A connection whose requests were refused as malformed, invalid or unauthenticated more than
  // kJunkPerSecond times in a second is not read for kJunkCooldownMs: its requests are dropped
  // unanswered before they are parsed (a legitimate client never comes near the bound).
  static constexpr int kJunkPerSecond = 32;
  static constexpr int64_t kJunkCooldownMs = 1000;
  struct JunkBudget {
    int64_t window_ms = 0;  // the start of the second `refused` counts in
    int refused = 0;
    int64_t cooldown_until_ms = 0;
  };

  void HandleMessage(std::vector<zmq::message_t>& parts) {
    if (parts.empty()) return;
    const int64_t now = options_.clock->NowMs();
    std::string connection(AsView(parts[0]));
    auto budget = junk_by_connection_.find(connection);
    if (budget != junk_by_connection_.end() && budget->second.cooldown_until_ms > now) {
      server_->requests_dropped_.fetch_add(1);
      return;
    }
    const uint64_t rejected_before = server_->requests_rejected_.load();
    token_refused_ = false;
    HandleRequest(parts);
    if (server_->requests_rejected_.load() == rejected_before && !token_refused_) return;
    if (junk_by_connection_.size() >= kMaxJunkConnections) {
      std::erase_if(junk_by_connection_, [now](const auto& e) {
        return e.second.cooldown_until_ms <= now && now - e.second.window_ms >= 1000;
      });
    }
    if (junk_by_connection_.size() >= kMaxJunkConnections) return;  // under a storm: unbudgeted
    JunkBudget& b = junk_by_connection_[connection];
    if (now - b.window_ms >= 1000) {
      b.window_ms = now;
      b.refused = 0;
    }
    if (++b.refused > kJunkPerSecond) {
      b.cooldown_until_ms = now + kJunkCooldownMs;
      b.refused = 0;
      CONNEX_LOG_WARN(
          "directory: a connection sent more than {} refused requests in a second; its requests "
          "are dropped unread for {} ms",
          kJunkPerSecond, kJunkCooldownMs);
    }
  }

  void HandleRequest(std::vector<zmq::message_t>& parts) {
    // DEALER peers send [identity, payload]; REQ peers [identity, "", payload].
    std::vector<zmq::message_t> envelope;
    const zmq::message_t* payload = nullptr;
    if (parts.size() == 2) {
      payload = &parts[1];
    } else if (parts.size() == 3 && parts[1].size() == 0) {
      payload = &parts[2];
    } else {
      // Answered, not dropped: the sender learns what it did wrong. The ERROR goes back with the
      // envelope the sender's socket type expects (identity, plus the empty delimiter of REQ).
      server_->requests_rejected_.fetch_add(1);
      if (parts.empty()) return;
      bool req = parts.size() >= 2 && parts[1].size() == 0;
      size_t frames = parts.size() - (req ? 2 : 1);
      envelope.emplace_back(parts[0].data(), parts[0].size());
      if (req) envelope.emplace_back();
      replies_.push_back(Reply{
          std::move(envelope),
          EncodeError(0, absl::InvalidArgumentError(StrCat(
                             "directory: malformed request: ", frames,
                             " frames; a request is one frame (DEALER: [request], REQ: an empty "
                             "delimiter, then [request])")))});
      return;
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      envelope.emplace_back(parts[i].data(), parts[i].size());

    std::string reply;
    absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(AsView(*payload));
    if (!frame.ok()) {
      server_->requests_rejected_.fetch_add(1);
      reply = EncodeError(0, Annotate(frame.status(), "directory: malformed request"));
    } else {
      absl::StatusOr<uint64_t> id = frame->body.Uint("id");
      if (!id.ok()) {
        server_->requests_rejected_.fetch_add(1);
        reply = EncodeError(0, Annotate(id.status(), "directory: malformed request"));
      } else if (frame->type == kSnapshot && server_->drop_snapshots_.load() > 0) {
        server_->drop_snapshots_.fetch_sub(1);
        server_->snapshots_dropped_.fetch_add(1);
        return;
      } else if (frame->type == kSnapshot) {
        // Checked now, served after this turn's cheap requests (ServeSnapshots).
        absl::StatusOr<PendingSnapshot> pending = ParseSnapshot(frame->body);
        if (pending.ok()) {
          pending->id = *id;
          pending->envelope = std::move(envelope);
          snapshots_.push_back(*std::move(pending));
          return;
        }
        if (pending.status().code() == absl::StatusCode::kInvalidArgument) {
          server_->requests_rejected_.fetch_add(1);
        }
        reply = EncodeError(*id, pending.status());
      } else {
        absl::StatusOr<std::string> ok = Dispatch(*frame, *id);
        if (ok.ok()) {
          server_->requests_served_.fetch_add(1);
          reply = *std::move(ok);
        } else {
          if (ok.status().code() == absl::StatusCode::kInvalidArgument) {
            server_->requests_rejected_.fetch_add(1);
          }
          reply = EncodeError(*id, ok.status());
        }
      }
    }
    replies_.push_back(Reply{std::move(envelope), std::move(reply)});
  }

  void SendReplies() {
    for (Reply& r : replies_) Send(r.envelope, std::move(r.frame));
    replies_.clear();
  }

  // The counter of unsent reply bytes of the connection `envelope` names (its ROUTER identity).
  std::shared_ptr<std::atomic<int64_t>> UnreadOf(const std::vector<zmq::message_t>& envelope) {
    std::string identity = envelope.empty() ? std::string() : std::string(AsView(envelope[0]));
    if (unread_by_connection_.size() >= prune_unread_at_) {
      // Connections with nothing unread are forgotten; the table is as large as those with a
      // backlog, which the total limit bounds.
      std::erase_if(unread_by_connection_,
                    [](const auto& entry) { return entry.second->load() <= 0; });
      prune_unread_at_ = std::max<size_t>(1024, 2 * unread_by_connection_.size());
    }
    auto& counter = unread_by_connection_[identity];
    if (counter == nullptr) counter = std::make_shared<std::atomic<int64_t>>(0);
    return counter;
  }

  // Sends one reply without copying it, counted as unread until libzmq is done with it.
  void Send(std::vector<zmq::message_t>& envelope, std::string frame) {
    auto data = std::make_unique<ReplyData>();
    data->bytes = std::move(frame);
    data->unread = unread_;
    data->connection = UnreadOf(envelope);
    const auto n = static_cast<int64_t>(data->bytes.size());
    unread_->total.fetch_add(n, std::memory_order_relaxed);
    data->connection->fetch_add(n, std::memory_order_relaxed);
    char* bytes = data->bytes.data();
    const size_t size = data->bytes.size();
    data->handed_over.store(true, std::memory_order_release);
    // From here libzmq owns `data`: FreeReply runs when the message is sent or dropped.
    zmq::message_t message(bytes, size, &FreeReply, data.release());
    try {
      for (zmq::message_t& e : envelope)
        router_.send(e, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      router_.send(message, zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      CONNEX_LOG_DEBUG("directory: reply dropped: {}", e.what());
    }
  }

  struct PendingSnapshot {
    std::vector<zmq::message_t> envelope;
    uint64_t id = 0;
    std::optional<std::string> model;
    std::optional<uint32_t> group;
  };

  absl::StatusOr<PendingSnapshot> ParseSnapshot(const wire::MapView& body) {
    // The table (addresses of every endpoint) is for members of the deployment only.
    CONNEX_RETURN_IF_ERROR(Annotate(CheckToken(body), "directory: SNAPSHOT"));
    PendingSnapshot p;
    if (body.Has("model")) {
      CONNEX_ASSIGN_OR_RETURN(p.model, body.Str("model"));
    }
    if (body.Has("group")) {
      CONNEX_ASSIGN_OR_RETURN(uint64_t g, body.Uint("group"));
      if (g > UINT32_MAX) return absl::InvalidArgumentError("SNAPSHOT.group: out of range");
      p.group = static_cast<uint32_t>(g);
    }
    if (snapshots_.size() >= kMaxPendingSnapshots) {
      return absl::UnavailableError(StrCat("directory: SNAPSHOT refused: ", snapshots_.size(),
                                           " snapshots are waiting to be served; retry"));
    }
    return p;
  }

  // Serves waiting SNAPSHOTs for at most kSnapshotBudgetMs, then returns to the loop (heartbeats
  // and other cheap requests are handled in between). A snapshot is encoded once per revision
  // and scope, and copied for each request of it.
  void ServeSnapshots() {
    const int64_t start = options_.clock->NowMs();
    while (!snapshots_.empty()) {
      PendingSnapshot p = std::move(snapshots_.front());
      snapshots_.pop_front();
      std::shared_ptr<std::atomic<int64_t>> connection = UnreadOf(p.envelope);
      std::string reply;
      if (const int64_t mine = connection->load(); mine > kMaxUnreadBytesPerConnection) {
        ++server_->snapshots_refused_;
        reply = EncodeError(
            p.id, absl::ResourceExhaustedError(
                      StrCat("directory: SNAPSHOT refused: ", Mib(mine),
                             " of earlier replies to this connection are unread (the limit is ",
                             Mib(kMaxUnreadBytesPerConnection), "); read them, then ask again")));
      } else if (const int64_t all = unread_->total.load(); all > kMaxUnreadBytes) {
        ++server_->snapshots_refused_;
        reply = EncodeError(p.id, absl::UnavailableError(StrCat(
                                      "directory: SNAPSHOT refused for now: ", Mib(all),
                                      " of replies are unread by their clients (the limit is ",
                                      Mib(kMaxUnreadBytes), "); retry")));
      } else {
        if (p.model) Watched(*p.model);
        wire::MapBuilder out;
        out.Uint("id", p.id).Entries(EncodedSnapshot(p.model, p.group));
        reply = wire::EncodeFrame(kOk, out);
        server_->requests_served_.fetch_add(1);
      }
      Send(p.envelope, std::move(reply));
      if (options_.clock->NowMs() - start >= kSnapshotBudgetMs) break;
    }
  }

  // The encoded snapshot of a scope at the current revision (records' lease_left_ms at most
  // kSnapshotCacheMs old).
  const wire::MapBuilder& EncodedSnapshot(const std::optional<std::string>& model,
                                          std::optional<uint32_t> group) {
    const int64_t now = options_.clock->NowMs();
    if (cache_revision_ != registry_.revision() || now - cache_at_ms_ > kSnapshotCacheMs ||
        cache_.size() >= kMaxCachedSnapshots) {
      cache_.clear();
      cache_revision_ = registry_.revision();
      cache_at_ms_ = now;
    }
    std::unique_ptr<wire::MapBuilder>& entry = cache_[{model, group}];
    if (entry == nullptr) {
      entry = std::make_unique<wire::MapBuilder>();
      EncodeSnapshot(registry_.Snap(server_->incarnation_, model, group), entry.get());
    }
    return *entry;
  }

  absl::Status CheckToken(const wire::MapView& body) {
    if (options_.token.empty()) return absl::OkStatus();
    absl::StatusOr<std::string> token = body.StrOr("token", "");
    if (!token.ok()) return token.status();
    if (token->empty()) {
      token_refused_ = true;
      return absl::PermissionDeniedError(
          "this directory requires a token: give the client its file with --token-file FILE "
          "(CONNEX_DIRECTORY_TOKEN_FILE) or the secret in CONNEX_DIRECTORY_TOKEN");
    }
    if (!SecretsEqual(*token, options_.token)) {
      token_refused_ = true;
      return absl::PermissionDeniedError("wrong directory token");
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<Lid> LidField(const wire::MapView& body) {
    CONNEX_ASSIGN_OR_RETURN(std::string text, body.Str("lid"));
    return Lid::Parse(text);
  }

  absl::StatusOr<std::string> Dispatch(const wire::Frame& frame, uint64_t id) {
    const wire::MapView& body = frame.body;
    const std::string& type = frame.type;
    if (type == kHello) {
      wire::MapBuilder out;
      out.Uint("id", id)
          .Str("pub", server_->pub_address_)
          .Uint("incarnation", server_->incarnation_)
          .Uint("revision", registry_.revision())
          .Int("lease_ttl_ms", options_.lease_ttl_ms)
          .Int("heartbeat_ms", options_.heartbeat_ms)
          .Bool("auth", !options_.token.empty())
          .Uint("version", wire::kVersion);
      return wire::EncodeFrame(kOk, out);
    }
    if (type == kJoin || type == kLeave || type == kHeartbeat || type == kReportFailed) {
      absl::StatusOr<Lid> lid = LidField(body);
      if (!lid.ok()) return Annotate(lid.status(), StrCat("directory: ", type));
      absl::StatusOr<std::string> reply = HandleLidRequest(type, *lid, body, id);
      if (!reply.ok()) {
        return Annotate(reply.status(), StrCat("directory: ", type, " for ", lid->ToString()));
      }
      return reply;
    }
    return absl::InvalidArgumentError(StrCat("directory: unknown request type '", type, "'"));
  }

  absl::StatusOr<std::string> HandleLidRequest(const std::string& type, const Lid& lid,
                                               const wire::MapView& body, uint64_t id) {
    wire::MapBuilder out;
    out.Uint("id", id);
    if (type == kHeartbeat) {
      CONNEX_ASSIGN_OR_RETURN(uint64_t epoch, body.Uint("epoch"));
      CONNEX_ASSIGN_OR_RETURN(std::string credential, body.StrOr("credential", ""));
      CONNEX_ASSIGN_OR_RETURN(Registry::HeartbeatResult held,
                              registry_.Heartbeat(lid, epoch, credential));
      out.Int("lease_ttl_ms", options_.lease_ttl_ms).Uint("epoch", held.epoch);
      if (!held.credential.empty()) out.Str("credential", held.credential);
      return wire::EncodeFrame(kOk, out);
    }
    CONNEX_RETURN_IF_ERROR(CheckToken(body));
    if (type == kJoin) {
      CONNEX_ASSIGN_OR_RETURN(std::vector<std::string> addresses, body.StrList("addresses"));
      std::map<std::string, std::string> metadata;
      if (body.Has("metadata")) {
        CONNEX_ASSIGN_OR_RETURN(metadata, body.StrMap("metadata"));
      }
      JoinAuth auth;
      CONNEX_ASSIGN_OR_RETURN(auth.credential, body.StrOr("credential", ""));
      CONNEX_ASSIGN_OR_RETURN(auth.exclusive, body.BoolOr("exclusive", false));
      CONNEX_ASSIGN_OR_RETURN(auth.force, body.BoolOr("force", false));
      CONNEX_ASSIGN_OR_RETURN(auth.admin_token, body.StrOr("admin", ""));
      CONNEX_ASSIGN_OR_RETURN(Registry::JoinResult joined,
                              registry_.Join(lid, addresses, metadata, auth));
      if (auth.force && joined.changed) {
        CONNEX_LOG_WARN("directory: {} taken over by the operator (forced JOIN), epoch {}",
                        lid.ToString(), joined.epoch);
      }
      out.Uint("epoch", joined.epoch)
          .Str("credential", joined.credential)
          .Int("lease_ttl_ms", options_.lease_ttl_ms);
      return wire::EncodeFrame(kOk, out);
    }
    Caller caller;
    CONNEX_ASSIGN_OR_RETURN(caller.credential, body.StrOr("credential", ""));
    CONNEX_ASSIGN_OR_RETURN(caller.admin_token, body.StrOr("admin", ""));
    CONNEX_ASSIGN_OR_RETURN(caller.name, body.StrOr("reporter", ""));
    if (caller.name.size() > 256) caller.name.resize(256);
    if (type == kLeave) {
      CONNEX_ASSIGN_OR_RETURN(uint64_t epoch, body.UintOr("epoch", 0));
      CONNEX_RETURN_IF_ERROR(registry_.Leave(lid, epoch, caller));
      return wire::EncodeFrame(kOk, out);
    }
    // REPORT_FAILED
    CONNEX_ASSIGN_OR_RETURN(uint64_t epoch, body.UintOr("epoch", 0));
    if (body.Has("member")) {
      CONNEX_ASSIGN_OR_RETURN(std::string member, body.Str("member"));
      absl::StatusOr<Lid> parsed = Lid::Parse(member);
      if (!parsed.ok()) return Annotate(parsed.status(), "REPORT_FAILED.member");
      caller.member = *parsed;
      CONNEX_ASSIGN_OR_RETURN(caller.member_credential, body.StrOr("member_credential", ""));
    }
    CONNEX_ASSIGN_OR_RETURN(bool evicted, registry_.ReportFailed(lid, epoch, caller));
    out.Bool("evicted", evicted);
    return wire::EncodeFrame(kOk, out);
  }

  void Publish() {
    for (const Event& e : registry_.TakeEvents()) {
      CONNEX_LOG_DEBUG("directory: {} {} {} epoch={}", e.revision, EventKindName(e.kind),
                       e.record.lid.ToString(), e.record.epoch);
      if (server_->drop_events_.load() > 0) {
        server_->drop_events_.fetch_sub(1);
        continue;
      }
      wire::MapBuilder body;
      EncodeEvent(e, server_->incarnation_, &body);
      std::string frame = wire::EncodeFrame(kEvent, body);
      std::string topic = EventTopic(e.record.lid.model);
      try {
        pub_.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        pub_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
      } catch (const zmq::error_t& err) {
        CONNEX_LOG_WARN("directory: publishing event {} failed: {}", e.revision, err.what());
      }
    }
  }

  // The directory-wide TICK, then one per model with a known latest event (a watcher of that
  // model alone finds a dropped event by it).
  void PublishTick() {
    wire::MapBuilder body;
    body.Uint("incarnation", server_->incarnation_).Uint("revision", registry_.revision());
    SendTick(kTickTopic, wire::EncodeFrame(kTick, body));
    const int64_t now = options_.clock->NowMs();
    for (auto it = watched_.begin(); it != watched_.end();) {
      it = now - it->second > kWatchedForMs ? watched_.erase(it) : std::next(it);
    }
    auto tick = [&](const std::string& model, uint64_t revision) {
      wire::MapBuilder m;
      m.Uint("incarnation", server_->incarnation_)
          .Uint("revision", registry_.revision())
          .Str("model", model)
          .Uint("model_revision", revision);
      SendTick(EventTopic(model), wire::EncodeFrame(kTick, m));
    };
    const auto& known = registry_.model_revisions();
    for (const auto& [model, revision] : known) tick(model, revision);
    for (const auto& [model, at] : watched_) {
      if (known.count(model) == 0) tick(model, registry_.ModelRevision(model));
    }
  }

  // A model somebody took a snapshot of is ticked for a while even without events: its new
  // watcher learns from the tick that its subscription is up. Bounded like the table.
  void Watched(const std::string& model) {
    if (watched_.size() >= options_.max_records && watched_.count(model) == 0) {
      auto oldest =
          std::min_element(watched_.begin(), watched_.end(),
                           [](const auto& a, const auto& b) { return a.second < b.second; });
      watched_.erase(oldest);
    }
    watched_[model] = options_.clock->NowMs();
  }

  void SendTick(std::string_view topic, const std::string& frame) {
    try {
      pub_.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      pub_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& err) {
      CONNEX_LOG_WARN("directory: publishing tick failed: {}", err.what());
    }
  }

  struct Reply {
    std::vector<zmq::message_t> envelope;
    std::string frame;
  };

  DirectoryServer* server_;
  const DirectoryServerOptions& options_;
  zmq::socket_t router_;
  zmq::socket_t pub_;
  Registry registry_;
  std::unique_ptr<StateFile> state_;  // null: in memory only
  bool saved_ = false;
  uint64_t saved_next_epoch_ = 0;
  uint64_t saved_revision_ = 0;
  std::vector<Reply> replies_;             // answers of one batch, sent once its state is durable
  std::deque<PendingSnapshot> snapshots_;  // checked, waiting for ServeSnapshots
  static constexpr int64_t kSnapshotBudgetMs = 20;
  static constexpr int64_t kTrimCheckEveryMs = 1'000;
  static constexpr size_t kTrimFreeBytes = 4 << 20;
  int64_t last_trim_check_ms_ = 0;
  static constexpr int64_t kSnapshotCacheMs = 100;
  static constexpr size_t kMaxCachedSnapshots = 64;
  std::map<std::pair<std::optional<std::string>, std::optional<uint32_t>>,
           std::unique_ptr<wire::MapBuilder>>
      cache_;
  uint64_t cache_revision_ = 0;
  int64_t cache_at_ms_ = 0;
  std::shared_ptr<Unread> unread_ = std::make_shared<Unread>();
  std::unordered_map<std::string, std::shared_ptr<std::atomic<int64_t>>> unread_by_connection_;
  size_t prune_unread_at_ = 1024;
  // Refusals per connection (HandleMessage); at most kMaxJunkConnections tracked.
  static constexpr size_t kMaxJunkConnections = 4096;
  std::unordered_map<std::string, JunkBudget> junk_by_connection_;
  bool token_refused_ = false;  // the request being handled was refused for its token
  static constexpr int64_t kWatchedForMs = 60'000;
  std::map<std::string, int64_t> watched_;  // model -> when it was last snapshotted
};

DirectoryServer::DirectoryServer(DirectoryServerOptions options)
    : options_(std::move(options)), context_(1) {}

absl::StatusOr<std::unique_ptr<DirectoryServer>> DirectoryServer::Start(
    DirectoryServerOptions options) {
  if (options.lease_ttl_ms <= 0 || options.heartbeat_ms <= 0 || options.tick_ms <= 0) {
    return absl::InvalidArgumentError("directory: lease TTL, heartbeat and tick must be positive");
  }
  CONNEX_RETURN_IF_ERROR(ValidateLeaseSettings(options.lease_ttl_ms, options.heartbeat_ms));
  CONNEX_RETURN_IF_ERROR(
      Annotate(ValidateTableLimits(options.max_records, options.max_records_per_model,
                                   options.max_record_bytes),
               "directory"));
  for (const auto& [flag, endpoint] :
       {std::pair<std::string_view, const std::string&>{"--bind", options.bind},
        std::pair<std::string_view, const std::string&>{"--pub", options.pub}}) {
    absl::StatusOr<TcpEndpoint> parsed = ParseTcpEndpoint(endpoint);
    if (!parsed.ok()) return Annotate(parsed.status(), StrCat("directory: ", flag));
    CONNEX_RETURN_IF_ERROR(
        CheckListenExposure(StrCat("directory ", flag), parsed->host, options.curve.enabled()));
  }
  std::unique_ptr<DirectoryServer> server(new DirectoryServer(std::move(options)));
  if (server->options_.curve.enabled()) {
    CONNEX_ASSIGN_OR_RETURN(
        server->zap_,
        ZapHandler::Start(server->context_, server->options_.curve.authorized, "directory"));
  }
  zmq::socket_t router(server->context_, zmq::socket_type::router);
  zmq::socket_t pub(server->context_, zmq::socket_type::pub);
  // Size first: a request larger than any valid one (a record of max_record_bytes and its
  // envelope) is dropped by ZeroMQ, which disconnects its sender, before this loop reads or parses
  // a byte of it (100 connections of 1 MiB junk JOINs used to delay every HELLO by ~17 s).
  ConfigureZmqSocket(
      router,
      std::min<int64_t>(kMaxRequestBytes, static_cast<int64_t>(server->options_.max_record_bytes) +
                                              kRequestEnvelopeBytes));
  ConfigureZmqSocket(pub, kMaxRequestBytes);
  MakeCurveServer(router, server->options_.curve);
  MakeCurveServer(pub, server->options_.curve);
  router.set(zmq::sockopt::router_mandatory, 0);
  pub.set(zmq::sockopt::sndhwm, kPubHighWaterMark);
  absl::StatusOr<std::string> bound = BindZmq(router, server->options_.bind);
  if (!bound.ok()) return Annotate(bound.status(), "directory: --bind");
  server->bind_address_ = *bound;
  bound = BindZmq(pub, server->options_.pub);
  if (!bound.ok()) return Annotate(bound.status(), "directory: --pub");
  server->pub_address_ = *bound;
  // The incarnation only has to differ from the previous one's: the wall clock and a random
  // byte. Epochs must never repeat: with a state dir they continue from the saved counter (a
  // first start seeds it from the wall clock, so that epochs keep growing from an in-memory
  // past); in memory only, they are seeded from the wall clock and may repeat after a restart.
  uint64_t now_ms = WallClockMillis();
  std::random_device rd;
  server->incarnation_ = (now_ms << 8) ^ (rd() & 0xff);
  std::unique_ptr<StateFile> state;
  std::optional<RegistryState> saved;
  if (!server->options_.state_dir.empty()) {
    CONNEX_ASSIGN_OR_RETURN(state, StateFile::Open(server->options_.state_dir));
    CONNEX_ASSIGN_OR_RETURN(saved, state->Load());
  }
  // A saved counter wins over the clock; only a first start seeds from it.
  uint64_t first_epoch = saved ? 1 : now_ms;
  server->loop_ = std::make_unique<Loop>(server.get(), std::move(router), std::move(pub),
                                         first_epoch, std::move(state), saved);
  // The first write proves the state dir writable before anyone is served.
  absl::Status persisted = server->loop_->Persist();
  if (!persisted.ok()) {
    return absl::InvalidArgumentError(
        StrCat("directory: --state-dir '", server->options_.state_dir, "': ", persisted.message()));
  }
  server->thread_ = std::thread([s = server.get()] { s->loop_->Run(); });
  return server;
}

void DirectoryServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  loop_.reset();
  zap_.reset();
}

DirectoryServer::~DirectoryServer() { Stop(); }

}  // namespace connex::directory
