#include "connex/transport/transfer_engine.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "connex/base/config.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::transport {

std::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kMem:
      return "mem";
    case Backend::kTcp:
      return "tcp";
    case Backend::kShm:
      return "shm";
    case Backend::kUcx:
      return "ucx";
  }
  return "?";
}

absl::StatusOr<Backend> ParseBackend(std::string_view text) {
  for (Backend b : {Backend::kAuto, Backend::kMem, Backend::kTcp, Backend::kShm, Backend::kUcx}) {
    if (text == BackendName(b)) return b;
  }
  return absl::InvalidArgumentError(
      StrCat("transport backend '", text, "' is not one of auto, mem, tcp, shm, ucx"));
}

absl::StatusOr<std::vector<Backend>> ParseAutoBackends(std::string_view text) {
  std::vector<Backend> out;
  for (absl::string_view part : absl::StrSplit(AsAbsl(text), ',')) {
    const std::string name(absl::StripAsciiWhitespace(part));
    absl::StatusOr<Backend> b = ParseBackend(name);
    if (!b.ok() || *b == Backend::kAuto || *b == Backend::kMem) {
      return absl::InvalidArgumentError(
          StrCat("auto backends '", text, "': '", name, "' is not one of shm, ucx, tcp"));
    }
    if (std::find(out.begin(), out.end(), *b) != out.end()) {
      return absl::InvalidArgumentError(
          StrCat("auto backends '", text, "': ", name, " is named twice"));
    }
    out.push_back(*b);
  }
  return out;
}

std::string_view PeerEventKindName(PeerEventKind kind) {
  switch (kind) {
    case PeerEventKind::kConnected:
      return "connected";
    case PeerEventKind::kDead:
      return "dead";
    case PeerEventKind::kSuspected:
      return "suspected";
  }
  return "?";
}

absl::StatusOr<UcxPeerErrors> ParseUcxPeerErrors(std::string_view text) {
  if (absl::AsciiStrToLower(AsAbsl(text)) == "auto") return UcxPeerErrors::kAuto;
  if (std::optional<bool> on = ParseBool(text))
    return *on ? UcxPeerErrors::kOn : UcxPeerErrors::kOff;
  return absl::InvalidArgumentError(
      StrCat("ucx peer errors '", text, "' is not auto, on (1/true/yes) or off (0/false/no)"));
}

absl::StatusOr<TransportOptions> TransportOptions::FromEnv(const Lid& local_lid) {
  TransportOptions o;
  o.local_lid = local_lid;
  CONNEX_ASSIGN_OR_RETURN(o.backend, ParseBackend(EnvString("CONNEX_PP_BACKEND", "auto")));
  CONNEX_ASSIGN_OR_RETURN(int64_t hb, EnvInt("CONNEX_TRANSPORT_HEARTBEAT_MS", 250, 1, 600000));
  CONNEX_ASSIGN_OR_RETURN(int64_t sus, EnvInt("CONNEX_TRANSPORT_SUSPECT_MS", 1000, 1, 3600000));
  CONNEX_ASSIGN_OR_RETURN(int64_t ct,
                          EnvInt("CONNEX_TRANSPORT_CONNECT_TIMEOUT_MS", 2000, 1, 600000));
  CONNEX_ASSIGN_OR_RETURN(int64_t conns, EnvInt("CONNEX_TRANSPORT_TCP_CONNECTIONS", 4, 1, 64));
  CONNEX_ASSIGN_OR_RETURN(int64_t sockbuf,
                          EnvInt("CONNEX_TRANSPORT_TCP_SOCKET_BUFFER", 256 << 10, 0, 256 << 20));
  CONNEX_ASSIGN_OR_RETURN(int64_t spin, EnvInt("CONNEX_TRANSPORT_SPIN_US", 50, 0, 100000));
  o.heartbeat_ms = static_cast<int>(hb);
  o.suspect_ms = static_cast<int>(sus);
  o.connect_timeout_ms = static_cast<int>(ct);
  o.tcp_connections = static_cast<int>(conns);
  o.tcp_socket_buffer = static_cast<int>(sockbuf);
  o.spin_us = static_cast<int>(spin);
  {
    absl::StatusOr<UcxPeerErrors> mode =
        ParseUcxPeerErrors(EnvString("CONNEX_TRANSPORT_UCX_PEER_ERRORS", "auto"));
    if (!mode.ok()) {
      return absl::InvalidArgumentError(
          StrCat("CONNEX_TRANSPORT_UCX_PEER_ERRORS: ", mode.status().message()));
    }
    o.ucx_peer_errors = *mode;
  }
  o.host = EnvString("CONNEX_TRANSPORT_HOST", "127.0.0.1");
  o.shm_dir = EnvString("CONNEX_TRANSPORT_SHM_DIR", "/dev/shm");
  {
    absl::StatusOr<std::vector<Backend>> backends =
        ParseAutoBackends(EnvString("CONNEX_TRANSPORT_AUTO_BACKENDS", "shm,ucx,tcp"));
    if (!backends.ok()) {
      return absl::InvalidArgumentError(
          StrCat("CONNEX_TRANSPORT_AUTO_BACKENDS: ", backends.status().message()));
    }
    o.auto_backends = *std::move(backends);
  }
  return o;
}

}  // namespace connex::transport
