// The embedded directory's loop (internal/server_loop.h): one request — its envelope (DEALER or
// REQ), its frame, the token — dispatched to the Registry (HELLO, JOIN, LEAVE, HEARTBEAT,
// REPORT_FAILED) or, for a SNAPSHOT, checked and queued for ServeSnapshots; the answer waits in
// replies_ until the state file holds what it says.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "connex/base/codec.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/internal/server_loop.h"
#include "connex/directory/protocol.h"
#include "connex/directory/registry.h"
#include "connex/directory/secret.h"

namespace connex::directory {

void DirectoryServer::Loop::HandleRequest(std::vector<zmq::message_t>& parts) {
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

absl::StatusOr<DirectoryServer::Loop::PendingSnapshot> DirectoryServer::Loop::ParseSnapshot(
    const wire::MapView& body) {
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

absl::Status DirectoryServer::Loop::CheckToken(const wire::MapView& body) {
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

absl::StatusOr<Lid> DirectoryServer::Loop::LidField(const wire::MapView& body) {
  CONNEX_ASSIGN_OR_RETURN(std::string text, body.Str("lid"));
  return Lid::Parse(text);
}

absl::StatusOr<std::string> DirectoryServer::Loop::Dispatch(const wire::Frame& frame, uint64_t id) {
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

absl::StatusOr<std::string> DirectoryServer::Loop::HandleLidRequest(const std::string& type,
                                                                    const Lid& lid,
                                                                    const wire::MapView& body,
                                                                    uint64_t id) {
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

}  // namespace connex::directory
