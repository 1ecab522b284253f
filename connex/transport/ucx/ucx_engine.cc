// The `ucx` transport (ucx_engine.h): the engine's start (the worker, the side channel's listener,
// the peer watch), its stop, and the read path — a get on the peer's endpoint with a cached rkey,
// fetching the rkey again when the owner invalidated it. The class is internal/ucx_engine_impl.h;
// the owner's side is ucx_memory.cc, the reader's endpoints and rkey cache ucx_endpoint.cc.
#include "connex/transport/ucx/ucx_engine.h"

#include <memory>
#include <utility>

#include "connex/base/curve.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/ucx/internal/ucx_engine_impl.h"

namespace connex::transport::ucx {

using internal::Fd;

absl::Status UcxEngine::Start() {
  // Before UCX opens any listener of its own.
  CONNEX_RETURN_IF_ERROR(CheckListenExposure("data plane (ucx)", options_.host,
                                             /*authenticated=*/false));
  CONNEX_RETURN_IF_ERROR(worker_.Init(options_.spin_us, options_.host));
  uint16_t port = 0;
  CONNEX_ASSIGN_OR_RETURN(Fd listen, internal::ListenTcp(options_.host, 0, &port));
  address_ = StrCat("ucx://", options_.host, ":", port);
  watch_ = std::make_unique<internal::PeerWatch>(events(), "ucx", options_.heartbeat_ms,
                                                 options_.suspect_ms);
  server_ = std::make_unique<internal::ConnectionServer>("ucx", std::move(listen),
                                                         [this](int fd) { Serve(fd); });
  return absl::OkStatus();
}

UcxEngine::~UcxEngine() {
  stopping_ = true;
  if (server_ != nullptr) server_->Stop();
  {
    MutexLock lock(&mu_);
    peers_.clear();
  }
  watch_.reset();
  FreeAllManagedBuffers();
}

absl::Status UcxEngine::TransferSyncRead(const PeerRef& ref, void* local, uint64_t remote_addr,
                                         size_t length) {
  if (length == 0) return absl::OkStatus();
  CONNEX_ASSIGN_OR_RETURN(
      internal::RegionTable::Pin pin,
      regions().Acquire(reinterpret_cast<uint64_t>(local), length, "ucx: read: local"));
  CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<Peer> peer, GetPeer(ref));
  auto gone = [&](std::string_view why) {
    return absl::UnavailableError(
        StrCat("ucx: read from ", ref.lid.ToString(), " at ", peer->live->address, ": ", why));
  };
  if (peer->live->dead) return gone("peer is dead");
  // Readers hold the rkey cache shared while their get is in flight; an invalidation (the
  // owner unregistering the range) takes it exclusively, so it waits for those gets.
  for (int attempt = 0; attempt < 3; ++attempt) {
    uint64_t seen = 0;
    {
      internal::ReaderLock rkeys(&peer->rkey_mu);
      if (ucp_rkey_h rkey = LookupRkey(*peer, remote_addr, length); rkey != nullptr) {
        void* req;
        {
          MutexLock lock(&worker_.mu);
          if (peer->ep == nullptr) return gone("endpoint closed");
          ucp_request_param_t param{};
          req = ucp_get_nbx(peer->ep, local, length, remote_addr, rkey, &param);
        }
        ucs_status_t st = WaitFor(*peer, req);
        if (st != UCS_OK) return gone(ucs_status_string(st));
        if (peer->live->dead) return gone("peer died during the read");
        return absl::OkStatus();
      }
      seen = peer->invalidations;
    }
    CONNEX_RETURN_IF_ERROR(FetchRkey(*peer, ref, remote_addr, length, seen));
  }
  return gone("the range keeps being unregistered");
}

Capabilities UcxEngine::GetCapabilities() const {
  Capabilities c;
  c.backend = "ucx";
  c.peer_events = true;
  c.hung_peer_detection = true;
  c.cross_process = true;
  return c;
}

absl::StatusOr<TransferEnginePtr> CreateUcxEngine(const TransportOptions& options) {
  auto engine = std::make_unique<UcxEngine>(options);
  CONNEX_RETURN_IF_ERROR(engine->Start());
  return engine;
}

}  // namespace connex::transport::ucx
