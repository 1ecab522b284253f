// UcxEngine: the `ucx` TransferEngine (ucx_engine.h), one class whose methods sit in rooms, as UCX
// keeps ucp_worker, ucp_ep and ucp_mm apart: the engine's start, stop and read path in
// ucx_engine.cc; the owner's side — memory mapped with UCX, rkeys handed out and invalidated over
// the side channel — in ucx_memory.cc; the reader's side — endpoints to peers, waiting on a
// request, the rkey cache — in ucx_endpoint.cc. The UCP worker and its progress thread are
// internal/worker.h. Thread-safe. Private to connex/transport/ucx.
#ifndef CONNEX_TRANSPORT_UCX_INTERNAL_UCX_ENGINE_IMPL_H_
#define CONNEX_TRANSPORT_UCX_INTERNAL_UCX_ENGINE_IMPL_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/mutex.h"
#include "connex/transport/internal/address.h"
#include "connex/transport/internal/connection_server.h"
#include "connex/transport/internal/engine_base.h"
#include "connex/transport/internal/peer_watch.h"
#include "connex/transport/internal/shared_mutex.h"
#include "connex/transport/internal/socket.h"
#include "connex/transport/ucx/internal/worker.h"

namespace connex::transport::ucx {

// The slice of every wait on the side channel or on a UCX request: how often it checks whether
// the peer died, the engine stops or a deadline passed.
inline constexpr int kSliceMs = 50;

class UcxEngine final : public internal::EngineBase {
 public:
  explicit UcxEngine(const TransportOptions& options) : EngineBase("ucx"), options_(options) {}
  ~UcxEngine() override;

  absl::Status Start();

  absl::Status TransferSyncRead(const PeerRef& ref, void* local, uint64_t remote_addr,
                                size_t length) override;
  std::vector<std::string> LocalAddresses() const override { return {address_}; }
  Capabilities GetCapabilities() const override;
  absl::Status Connect(const PeerRef& ref) override { return GetPeer(ref).status(); }

 protected:
  // ucx_memory.cc. Managed buffers are allocated by UCX, so that its shared-memory transports
  // (posix, sysv) can map them into readers directly, as ucx_perftest's buffers are; user memory
  // registered with RegisterMemory is mapped as it is (cma or software RMA on this host, RDMA
  // elsewhere).
  absl::StatusOr<Backing> AllocateBacking(size_t length) override;
  // The memory went with ucp_mem_unmap in OnUnregister.
  void FreeBacking(void* addr, size_t length, uint64_t cookie) override;
  absl::Status OnRegister(internal::RegionTable::Region& region) override;
  void OnUnregister(const internal::RegionTable::Region& region) override;

 private:
  struct MemoryKey {
    ucp_mem_h memh = nullptr;
    std::string packed;
  };
  struct CachedRkey {
    uint64_t base = 0, length = 0;
    ucp_rkey_h rkey = nullptr;
  };
  struct Peer {
    UcxEngine* engine = nullptr;
    Lid lid;
    std::string hostport;
    std::shared_ptr<internal::Liveness> live;
    ucp_ep_h ep = nullptr;            // guarded by worker_.mu
    std::atomic<bool> broken{false};  // ep closed by force: the next GetPeer reconnects
    Mutex data_mu;
    internal::Fd data ABSL_GUARDED_BY(data_mu);
    internal::SharedMutex rkey_mu;
    std::map<uint64_t, CachedRkey> rkeys ABSL_GUARDED_BY(rkey_mu);  // by base
    uint64_t invalidations ABSL_GUARDED_BY(rkey_mu) = 0;
    ~Peer();
    void CloseEpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine->worker_.mu);
  };
  // The server's view of a reader's control connection (INVALIDATE goes out on it).
  struct ControlConn {
    int fd = -1;
    Mutex mu;
    bool closed = false;
    uint64_t invalidations_sent = 0;
    uint64_t invalidations_acked = 0;
  };

  // ---- the reader's side: ucx_endpoint.cc ----

  // True when every lane of `ep` is one of UCX's shared-memory transports, which hold no
  // connection to the peer (from ucp_ep_print_info: "lane[0]:  3:sysv/memory.0 ...").
  static bool SharedMemoryOnly(ucp_ep_h ep);
  // Closes a new endpoint to a live peer with a flush (no force), up to `timeout_ms`.
  void CloseQuietlyLocked(ucp_ep_h ep, int timeout_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_.mu);
  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status);
  // Progresses until `req` completes. If the peer dies or is suspected meanwhile, the endpoint
  // is closed by force so that the request completes (with an error) instead of hanging. An
  // endpoint without peer error handling may leave a request that needs the dead peer's help
  // (UCX's tcp transport emulates gets) in progress for ever: one slice after the close, the
  // request is abandoned (UCX frees it should it ever complete; its endpoint is gone, so
  // nothing writes into `local` any more).
  ucs_status_t WaitFor(Peer& peer, void* req);
  static ucp_rkey_h LookupRkey(Peer& peer, uint64_t addr, uint64_t length)
      ABSL_SHARED_LOCKS_REQUIRED(peer.rkey_mu);
  // Asks the owner for the rkey of the region that holds the range and caches it, unless an
  // invalidation arrived since `seen` (then the caller looks again).
  absl::Status FetchRkey(Peer& peer, const PeerRef& ref, uint64_t addr, uint64_t length,
                         uint64_t seen);
  void HandleInvalidate(Peer* peer, int fd, const internal::FrameHeader& h);
  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const PeerRef& ref);
  absl::StatusOr<internal::Fd> Dial(const internal::HostPort& hp, const Lid& lid,
                                    internal::ChannelKind kind);

  // ---- the owner's side (the side channel's server): ucx_memory.cc ----

  void Serve(int fd);

  const TransportOptions options_;
  Worker worker_;
  std::string address_;
  std::unique_ptr<internal::PeerWatch> watch_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<internal::ConnectionServer> server_;

  Mutex keys_mu_;
  absl::flat_hash_map<uint64_t, MemoryKey> keys_ ABSL_GUARDED_BY(keys_mu_);  // by region base

  Mutex mu_;
  absl::flat_hash_map<Lid, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);

  Mutex server_mu_;
  std::list<std::shared_ptr<ControlConn>> controls_ ABSL_GUARDED_BY(server_mu_);
};

}  // namespace connex::transport::ucx

#endif  // CONNEX_TRANSPORT_UCX_INTERNAL_UCX_ENGINE_IMPL_H_
