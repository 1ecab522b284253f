#include "connex/transport/tcp/tcp_engine.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/internal/address.h"
#include "connex/transport/internal/connection_server.h"
#include "connex/transport/internal/engine_base.h"
#include "connex/transport/internal/peer_watch.h"
#include "connex/transport/internal/socket.h"

namespace connex::transport::tcp {
namespace {

using internal::Fd;
using internal::FrameHeader;
using internal::FrameType;

constexpr int kSliceMs = 50;  // how often a blocked receive checks liveness

class TcpEngine final : public internal::EngineBase {
 public:
  explicit TcpEngine(const TransportOptions& options) : EngineBase("tcp"), options_(options) {}

  absl::Status Start() {
    uint16_t port = 0;
    CONNEX_ASSIGN_OR_RETURN(Fd listen, internal::ListenTcp(options_.host, 0, &port));
    address_ = StrCat("tcp://", options_.host, ":", port);
    watch_ = std::make_unique<internal::PeerWatch>(events(), "tcp", options_.heartbeat_ms,
                                                   options_.suspect_ms);
    server_ = std::make_unique<internal::ConnectionServer>("tcp", std::move(listen),
                                                           [this](int fd) { Serve(fd); });
    return absl::OkStatus();
  }

  ~TcpEngine() override {
    stopping_ = true;
    if (server_ != nullptr) server_->Stop();
    {
      MutexLock lock(&mu_);
      peers_.clear();
    }
    watch_.reset();
    FreeAllManagedBuffers();
  }

  absl::Status TransferSyncRead(const PeerRef& ref, void* local, uint64_t remote_addr,
                                size_t length) override {
    if (length == 0) return absl::OkStatus();
    CONNEX_ASSIGN_OR_RETURN(
        internal::RegionTable::Pin pin,
        regions().Acquire(reinterpret_cast<uint64_t>(local), length, "tcp: read: local"));
    CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<Peer> peer, GetPeer(ref));
    CONNEX_ASSIGN_OR_RETURN(Fd conn, CheckOut(*peer));
    internal::AbortCheck abort = [&peer]() {
      if (peer->live->dead) return absl::UnavailableError("peer died");
      if (peer->live->suspected) return absl::UnavailableError("peer stopped answering");
      return absl::OkStatus();
    };
    FrameHeader req = internal::MakeFrame(FrameType::kRead, remote_addr, length);
    absl::Status s = internal::SendFrame(conn.get(), req);
    FrameHeader resp;
    std::string payload;
    if (s.ok())
      s = internal::RecvFrame(conn.get(), &resp, &payload, options_.spin_us, kSliceMs, abort);
    if (s.ok()) {
      if (resp.type == static_cast<uint16_t>(FrameType::kError)) {
        CheckIn(*peer, std::move(conn));
        return internal::StatusFromErrorFrame(resp, payload);
      }
      if (resp.type != static_cast<uint16_t>(FrameType::kData) || resp.b != length) {
        s = absl::UnavailableError(StrCat("unexpected response type ", resp.type));
      } else {
        s = internal::RecvAll(conn.get(), local, length, options_.spin_us, kSliceMs, abort);
      }
    }
    if (!s.ok()) {
      DropConnection(*peer);  // conn closes: its stream position is unknown
      return absl::UnavailableError(StrCat("tcp: read from ", ref.lid.ToString(), " at ",
                                           peer->live->address, ": ", s.message()));
    }
    CheckIn(*peer, std::move(conn));
    return absl::OkStatus();
  }

  std::vector<std::string> LocalAddresses() const override { return {address_}; }

  Capabilities GetCapabilities() const override {
    Capabilities c;
    c.backend = "tcp";
    c.peer_events = true;
    c.hung_peer_detection = true;
    c.cross_process = true;
    return c;
  }

  absl::Status Connect(const PeerRef& ref) override { return GetPeer(ref).status(); }

 private:
  struct Peer {
    Lid lid;
    std::string hostport;
    internal::HostPort hp;
    std::shared_ptr<internal::Liveness> live;
    Mutex mu;
    std::vector<Fd> idle ABSL_GUARDED_BY(mu);
    int open ABSL_GUARDED_BY(mu) = 0;
    bool retired ABSL_GUARDED_BY(mu) = false;
  };

  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const PeerRef& ref) {
    std::optional<std::string> hostport = internal::FindAddress(ref.addresses, "tcp");
    if (!hostport) {
      return absl::InvalidArgumentError(
          StrCat("tcp: peer ", ref.lid.ToString(), " publishes no tcp:// address"));
    }
    {
      MutexLock lock(&mu_);
      auto it = peers_.find(ref.lid);
      if (it != peers_.end() && it->second->hostport == *hostport && !it->second->live->dead) {
        return it->second;
      }
    }
    CONNEX_ASSIGN_OR_RETURN(internal::HostPort hp, internal::ParseHostPort(*hostport));
    absl::StatusOr<Fd> control = Dial(hp, ref.lid, internal::ChannelKind::kControl);
    if (!control.ok()) return control.status();
    MutexLock lock(&mu_);
    auto& slot = peers_[ref.lid];
    if (slot != nullptr && slot->hostport == *hostport && !slot->live->dead) return slot;
    if (slot != nullptr) Retire(*slot);
    auto peer = std::make_shared<Peer>();
    peer->lid = ref.lid;
    peer->hostport = *hostport;
    peer->hp = hp;
    peer->live = watch_->Watch(std::move(*control), ref.lid, StrCat("tcp://", *hostport));
    slot = peer;
    return peer;
  }

  void Retire(Peer& peer) {
    watch_->Unwatch(peer.live);
    MutexLock lock(&peer.mu);
    peer.retired = true;
    peer.open -= static_cast<int>(peer.idle.size());
    peer.idle.clear();
  }

  absl::StatusOr<Fd> Dial(const internal::HostPort& hp, const Lid& lid,
                          internal::ChannelKind kind) {
    std::string where = StrCat(lid.ToString(), " at tcp://", hp.host, ":", hp.port);
    absl::StatusOr<Fd> fd = internal::ConnectTcp(hp.host, hp.port, options_.connect_timeout_ms);
    if (!fd.ok()) {
      return absl::UnavailableError(
          StrCat("tcp: cannot reach ", where, ": ", fd.status().message()));
    }
    internal::TuneTcp(fd->get(),
                      kind == internal::ChannelKind::kData ? options_.tcp_socket_buffer : 0);
    absl::Status s = internal::ClientHandshake(fd->get(), kind, options_.local_lid, lid,
                                               options_.connect_timeout_ms);
    if (!s.ok()) {
      return absl::Status(s.code() == absl::StatusCode::kFailedPrecondition
                              ? s.code()
                              : absl::StatusCode::kUnavailable,
                          StrCat("tcp: handshake with ", where, ": ", s.message()));
    }
    return fd;
  }

  absl::StatusOr<Fd> CheckOut(Peer& peer) {
    {
      MutexLock lock(&peer.mu);
      const int max_open = options_.tcp_connections;
      auto usable = [&peer, max_open]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(peer.mu) {
        return !peer.idle.empty() || peer.open < max_open || peer.retired || peer.live->dead;
      };
      while (!peer.mu.AwaitWithTimeout(absl::Condition(&usable), absl::Milliseconds(kSliceMs))) {
      }
      if (peer.retired || peer.live->dead) {
        return absl::UnavailableError(StrCat("tcp: peer ", peer.lid.ToString(), " is dead"));
      }
      if (!peer.idle.empty()) {
        Fd fd = std::move(peer.idle.back());
        peer.idle.pop_back();
        return fd;
      }
      ++peer.open;
    }
    absl::StatusOr<Fd> fd = Dial(peer.hp, peer.lid, internal::ChannelKind::kData);
    if (!fd.ok()) DropConnection(peer);
    return fd;
  }

  void CheckIn(Peer& peer, Fd fd) {
    MutexLock lock(&peer.mu);
    if (peer.retired || peer.live->dead) {
      --peer.open;
      return;
    }
    peer.idle.push_back(std::move(fd));
  }

  void DropConnection(Peer& peer) {
    MutexLock lock(&peer.mu);
    --peer.open;
  }

  // ---- server side ----

  void Serve(int fd) {
    std::string client;
    absl::StatusOr<internal::ChannelKind> kind =
        internal::ServerHandshake(fd, options_.local_lid, options_.connect_timeout_ms, &client);
    if (kind.ok()) {
      internal::TuneTcp(fd, *kind == internal::ChannelKind::kData ? options_.tcp_socket_buffer : 0);
      // A reader that stops reading must not hold our memory forever.
      timeval tv{options_.suspect_ms / 1000, (options_.suspect_ms % 1000) * 1000};
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      ServeRequests(fd, *kind == internal::ChannelKind::kData ? options_.spin_us : 0);
    }
  }

  void ServeRequests(int fd, int spin_us) {
    internal::AbortCheck abort = [this]() {
      return stopping_ ? absl::CancelledError("stopping") : absl::OkStatus();
    };
    while (true) {
      FrameHeader h;
      if (!internal::RecvFrame(fd, &h, nullptr, spin_us, kSliceMs, abort).ok()) return;
      switch (static_cast<FrameType>(h.type)) {
        case FrameType::kPing:
          if (!internal::SendFrame(fd, internal::MakeFrame(FrameType::kPong)).ok()) return;
          break;
        case FrameType::kRead: {
          absl::StatusOr<internal::RegionTable::Pin> pin = regions().Acquire(
              h.a, h.b, StrCat("tcp: read of ", options_.local_lid.ToString(), ": remote"));
          if (!pin.ok()) {
            if (!internal::SendError(fd, pin.status()).ok()) return;
            break;
          }
          FrameHeader resp = internal::MakeFrame(FrameType::kData, 0, h.b);
          iovec iov[2] = {{&resp, sizeof(resp)}, {reinterpret_cast<void*>(h.a), h.b}};
          if (!internal::SendAll(fd, iov, 2).ok()) return;
          break;
        }
        default:
          internal::SendError(
              fd, absl::InvalidArgumentError(StrCat("tcp: unexpected frame type ", h.type)))
              .IgnoreError();
          return;
      }
    }
  }

  const TransportOptions options_;
  std::string address_;
  std::unique_ptr<internal::PeerWatch> watch_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<internal::ConnectionServer> server_;
  Mutex mu_;
  absl::flat_hash_map<Lid, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<TransferEnginePtr> CreateTcpEngine(const TransportOptions& options) {
  auto engine = std::make_unique<TcpEngine>(options);
  CONNEX_RETURN_IF_ERROR(engine->Start());
  return engine;
}

}  // namespace connex::transport::tcp
