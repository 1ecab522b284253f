// The `ucx` transport, the reader's side (the class is internal/ucx_engine_impl.h): a peer's
// endpoint — the side channel dialed, the worker address fetched, the UCP endpoint created with or
// without peer error handling (`auto`: off only for a same-host peer reached over shared memory
// alone) — and its teardown; waiting on a request while the peer may die; and the rkey cache,
// filled over the side channel and emptied by the owner's INVALIDATE.
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "connex/base/check.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/ucx/internal/ucx_engine_impl.h"

namespace connex::transport::ucx {

using internal::Fd;
using internal::FrameHeader;
using internal::FrameType;

UcxEngine::Peer::~Peer() {
  MutexLock lock(&engine->worker_.mu);
  for (auto& [base, r] : rkeys) ucp_rkey_destroy(r.rkey);
  if (ep != nullptr) CloseEpLocked();
}

void UcxEngine::Peer::CloseEpLocked() {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* req = ucp_ep_close_nbx(ep, &param);
  ep = nullptr;
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
      ucp_worker_progress(engine->worker_.worker());
    }
    ucp_request_free(req);
  }
}

bool UcxEngine::SharedMemoryOnly(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return false;
  ucp_ep_print_info(ep, f);
  fclose(f);
  std::string info(text, size);
  free(text);
  int lanes = 0;
  for (size_t at = info.find("lane["); at != std::string::npos; at = info.find("lane[", at + 1)) {
    size_t colon = info.find(':', info.find(']', at));
    size_t name = info.find(':', colon + 1);
    size_t slash = info.find('/', name);
    if (colon == std::string::npos || name == std::string::npos || slash == std::string::npos) {
      return false;
    }
    std::string transport = info.substr(name + 1, slash - name - 1);
    if (transport != "sysv" && transport != "posix" && transport != "cma" && transport != "knem" &&
        transport != "xpmem") {
      return false;
    }
    ++lanes;
  }
  return lanes > 0;
}

void UcxEngine::CloseQuietlyLocked(ucp_ep_h ep, int timeout_ms) {
  ucp_request_param_t param{};
  void* req = ucp_ep_close_nbx(ep, &param);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
  int64_t deadline = internal::NowUs() + int64_t{timeout_ms} * 1000;
  while (ucp_request_check_status(req) == UCS_INPROGRESS && internal::NowUs() < deadline) {
    ucp_worker_progress(worker_.worker());
  }
  if (ucp_request_check_status(req) == UCS_INPROGRESS) {
    ucp_request_cancel(worker_.worker(), req);
  }
  ucp_request_free(req);
}

void UcxEngine::OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  if (peer->live != nullptr) {
    peer->engine->watch_->ReportDead(peer->live,
                                     StrCat("endpoint error: ", ucs_status_string(status)));
  }
}

ucs_status_t UcxEngine::WaitFor(Peer& peer, void* req) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  int64_t next_check = internal::NowUs() + kSliceMs * 1000;
  int64_t abandon_at = -1;
  Worker::ActiveWaiter active(worker_);
  while (true) {
    MutexLock lock(&worker_.mu);
    ucp_worker_progress(worker_.worker());
    ucs_status_t st = ucp_request_check_status(req);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(req);
      return st;
    }
    int64_t now = internal::NowUs();
    if (now >= next_check) {
      next_check = now + kSliceMs * 1000;
      if ((peer.live->dead || peer.live->suspected) && abandon_at < 0) {
        peer.broken = true;
        // The lock held is the one CloseEpLocked names: a peer belongs to this engine.
        CONNEX_DCHECK(peer.engine == this);
        peer.engine->worker_.mu.AssertHeld();
        if (peer.ep != nullptr) peer.CloseEpLocked();
        abandon_at = now + kSliceMs * 1000;
      } else if (abandon_at >= 0 && now >= abandon_at) {
        ucp_request_free(req);
        return UCS_ERR_ENDPOINT_TIMEOUT;
      }
    }
  }
}

ucp_rkey_h UcxEngine::LookupRkey(Peer& peer, uint64_t addr, uint64_t length) {
  auto it = peer.rkeys.upper_bound(addr);
  if (it == peer.rkeys.begin()) return nullptr;
  --it;
  if (addr >= it->second.base && addr + length >= addr &&
      addr + length <= it->second.base + it->second.length) {
    return it->second.rkey;
  }
  return nullptr;
}

absl::Status UcxEngine::FetchRkey(Peer& peer, const PeerRef& ref, uint64_t addr, uint64_t length,
                                  uint64_t seen) {
  std::string packed;
  FrameHeader h;
  {
    MutexLock lock(&peer.data_mu);
    if (!peer.data.valid()) return absl::UnavailableError("ucx: side channel lost");
    absl::Status s =
        internal::SendFrame(peer.data.get(), internal::MakeFrame(FrameType::kRkey, addr, length));
    if (s.ok()) {
      s = internal::RecvFrame(peer.data.get(), &h, &packed, 0, kSliceMs, [&peer]() {
        return peer.live->dead ? absl::UnavailableError("peer died") : absl::OkStatus();
      });
    }
    if (!s.ok()) {
      peer.data.reset();
      return absl::UnavailableError(
          StrCat("ucx: rkey request to ", ref.lid.ToString(), ": ", s.message()));
    }
  }
  if (h.type == static_cast<uint16_t>(FrameType::kError)) {
    return internal::StatusFromErrorFrame(h, packed);
  }
  if (h.type != static_cast<uint16_t>(FrameType::kRkeyInfo)) {
    return absl::UnavailableError("ucx: bad rkey reply");
  }
  internal::WriterLock lock(&peer.rkey_mu);
  if (peer.invalidations != seen || peer.rkeys.count(h.a) > 0) return absl::OkStatus();
  MutexLock wl(&worker_.mu);
  if (peer.ep == nullptr) return absl::UnavailableError("ucx: endpoint closed");
  ucp_rkey_h rkey = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(peer.ep, packed.data(), &rkey);
  if (st != UCS_OK) return UcsError("rkey unpack", st);
  peer.rkeys.emplace(h.a, CachedRkey{h.a, h.b, rkey});
  return absl::OkStatus();
}

void UcxEngine::HandleInvalidate(Peer* peer, int fd, const FrameHeader& h) {
  {
    internal::WriterLock lock(&peer->rkey_mu);  // waits for gets in flight
    ++peer->invalidations;
    auto it = peer->rkeys.find(h.a);
    if (it != peer->rkeys.end()) {
      MutexLock wl(&worker_.mu);
      ucp_rkey_destroy(it->second.rkey);
      peer->rkeys.erase(it);
    }
  }
  FrameHeader ack = internal::MakeFrame(FrameType::kInvalidateAck, h.a);
  (void)!send(fd, &ack, sizeof(ack), MSG_NOSIGNAL);
}

absl::StatusOr<std::shared_ptr<UcxEngine::Peer>> UcxEngine::GetPeer(const PeerRef& ref) {
  std::optional<std::string> hostport = internal::FindAddress(ref.addresses, "ucx");
  if (!hostport) {
    return absl::InvalidArgumentError(
        StrCat("ucx: peer ", ref.lid.ToString(), " publishes no ucx:// address"));
  }
  {
    MutexLock lock(&mu_);
    auto it = peers_.find(ref.lid);
    if (it != peers_.end() && it->second->hostport == *hostport && !it->second->live->dead &&
        !it->second->broken) {
      return it->second;
    }
  }
  CONNEX_ASSIGN_OR_RETURN(internal::HostPort hp, internal::ParseHostPort(*hostport));
  CONNEX_ASSIGN_OR_RETURN(Fd control, Dial(hp, ref.lid, internal::ChannelKind::kControl));
  CONNEX_ASSIGN_OR_RETURN(Fd data, Dial(hp, ref.lid, internal::ChannelKind::kData));
  FrameHeader h;
  std::string worker_address;
  absl::Status s = internal::SendFrame(data.get(), internal::MakeFrame(FrameType::kWorkerAddress));
  if (s.ok()) {
    int64_t deadline = internal::NowUs() + int64_t{options_.connect_timeout_ms} * 1000;
    s = internal::RecvFrame(data.get(), &h, &worker_address, 0, kSliceMs, [deadline]() {
      return internal::NowUs() > deadline ? absl::UnavailableError("timed out") : absl::OkStatus();
    });
  }
  if (!s.ok() || h.type != static_cast<uint16_t>(FrameType::kWorkerAddressInfo)) {
    return absl::UnavailableError(
        StrCat("ucx: no worker address from ", ref.lid.ToString(), ": ", s.message()));
  }
  auto peer = std::make_shared<Peer>();
  peer->engine = this;
  peer->lid = ref.lid;
  peer->hostport = *hostport;
  {
    MutexLock lock(&peer->data_mu);
    peer->data = std::move(data);
  }
  Peer* raw = peer.get();
  // Watched before the endpoint exists, so that its error callback finds `live`.
  peer->live = watch_->Watch(std::move(control), ref.lid, StrCat("ucx://", *hostport),
                             [this, raw](int fd, const FrameHeader& f, const std::string&) {
                               if (f.type == static_cast<uint16_t>(FrameType::kInvalidate)) {
                                 HandleInvalidate(raw, fd, f);
                               }
                             });
  {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
    // h.a: the peer's HostId (0 from a peer that does not say).
    bool peer_errors =
        options_.ucx_peer_errors == UcxPeerErrors::kOn ||
        (options_.ucx_peer_errors == UcxPeerErrors::kAuto && h.a != internal::HostId());
    ep.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &UcxEngine::OnEndpointError;
    ep.err_handler.arg = raw;
    MutexLock lock(&worker_.mu);
    ucs_status_t st = ucp_ep_create(worker_.worker(), &ep, &peer->ep);
    if (st == UCS_OK && options_.ucx_peer_errors == UcxPeerErrors::kAuto && !peer_errors &&
        !SharedMemoryOnly(peer->ep)) {
      // UCX chose a transport with connections (here: its tcp) for this same-host peer.
      // Closing such an endpoint by force without peer error handling is undefined in UCX
      // (observed: an error callback on a closed endpoint), so it gets peer error handling.
      CONNEX_LOG_DEBUG(
          "ucx: {} is on this host but not reached over shared memory: "
          "endpoint with peer error handling",
          ref.lid.ToString());
      CloseQuietlyLocked(peer->ep, options_.connect_timeout_ms);
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      st = ucp_ep_create(worker_.worker(), &ep, &peer->ep);
    }
    if (st != UCS_OK) {
      peer->ep = nullptr;
      watch_->Unwatch(peer->live);
      return UcsError(StrCat("endpoint to ", ref.lid.ToString()), st);
    }
  }
  MutexLock lock(&mu_);
  auto& slot = peers_[ref.lid];
  if (slot != nullptr && slot->hostport == *hostport && !slot->live->dead && !slot->broken) {
    watch_->Unwatch(peer->live);
    return slot;
  }
  if (slot != nullptr) watch_->Unwatch(slot->live);
  slot = peer;
  return peer;
}

absl::StatusOr<Fd> UcxEngine::Dial(const internal::HostPort& hp, const Lid& lid,
                                   internal::ChannelKind kind) {
  std::string where = StrCat(lid.ToString(), " at ucx://", hp.host, ":", hp.port);
  absl::StatusOr<Fd> fd = internal::ConnectTcp(hp.host, hp.port, options_.connect_timeout_ms);
  if (!fd.ok()) {
    return absl::UnavailableError(StrCat("ucx: cannot reach ", where, ": ", fd.status().message()));
  }
  internal::TuneTcp(fd->get(), 0);
  absl::Status s = internal::ClientHandshake(fd->get(), kind, options_.local_lid, lid,
                                             options_.connect_timeout_ms);
  if (!s.ok()) {
    return absl::Status(s.code() == absl::StatusCode::kFailedPrecondition
                            ? s.code()
                            : absl::StatusCode::kUnavailable,
                        StrCat("ucx: handshake with ", where, ": ", s.message()));
  }
  return fd;
}

}  // namespace connex::transport::ucx
