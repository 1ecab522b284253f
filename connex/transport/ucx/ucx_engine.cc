#include "connex/transport/ucx/ucx_engine.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "connex/base/check.h"
#include "connex/base/curve.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/internal/address.h"
#include "connex/transport/internal/connection_server.h"
#include "connex/transport/internal/engine_base.h"
#include "connex/transport/internal/peer_watch.h"
#include "connex/transport/internal/shared_mutex.h"
#include "connex/transport/internal/socket.h"

namespace connex::transport::ucx {
namespace {

using internal::Fd;
using internal::FrameHeader;
using internal::FrameType;

constexpr int kSliceMs = 50;
constexpr uint64_t kUcxAllocated = 1;  // Backing cookie: allocated (and mapped) by UCX

absl::Status UcsError(std::string_view what, ucs_status_t status) {
  return absl::UnavailableError(StrCat("ucx: ", what, ": ", ucs_status_string(status)));
}

// UCP context + worker, and the progress thread that serves one-sided operations that need the
// target's help (UCX's tcp transport emulates RMA with active messages). Every UCP call is made
// under `mu` (the worker is created UCS_THREAD_MODE_SERIALIZED).
class Worker {
 public:
  ~Worker() {
    stop_ = true;
    uint64_t one = 1;
    if (wake_.valid()) (void)!write(wake_.get(), &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  // `host`: the address this endpoint listens on. UCX's own tcp transport listens on every
  // network device unless told otherwise; an endpoint on loopback keeps it on `lo` (unless
  // UCX_NET_DEVICES says which devices to use).
  absl::Status Init(int spin_us, const std::string& host) {
    spin_us_ = spin_us;
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return UcsError("config", st);
    if (IsLoopbackHost(host) && std::getenv("UCX_NET_DEVICES") == nullptr) {
      st = ucp_config_modify(config, "NET_DEVICES", "lo");
      if (st != UCS_OK) {
        ucp_config_release(config);
        return UcsError("config NET_DEVICES=lo", st);
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) return UcsError("init", st);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) return UcsError("worker", st);
    st = ucp_worker_get_efd(worker_, &efd_);
    if (st != UCS_OK) return UcsError("worker fd", st);
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    st = ucp_worker_get_address(worker_, &addr, &len);
    if (st != UCS_OK) return UcsError("worker address", st);
    address_.assign(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(worker_, addr);
    wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const std::string& address() const { return address_; }
  Mutex mu;

  // A reader busy-polling the worker for its own request (WaitFor) progresses everything; the
  // progress thread then stays out of its way instead of contending for `mu` and the CPU.
  class ActiveWaiter {
   public:
    explicit ActiveWaiter(Worker& w) : w_(w) { w_.waiters_.fetch_add(1); }
    ~ActiveWaiter() { w_.waiters_.fetch_sub(1); }

   private:
    Worker& w_;
  };

 private:
  void Run() {
    int64_t idle_since = internal::NowUs();
    while (!stop_) {
      if (waiters_.load() > 0) {
        pollfd wake = {wake_.get(), POLLIN, 0};
        poll(&wake, 1, 1);
        idle_since = internal::NowUs();
        continue;
      }
      unsigned progressed;
      {
        MutexLock lock(&mu);
        progressed = ucp_worker_progress(worker_);
      }
      int64_t now = internal::NowUs();
      if (progressed > 0) {
        idle_since = now;
        continue;
      }
      if (now - idle_since < spin_us_) continue;
      ucs_status_t st;
      {
        MutexLock lock(&mu);
        st = ucp_worker_arm(worker_);
      }
      if (st == UCS_ERR_BUSY) continue;
      pollfd fds[2] = {{efd_, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      poll(fds, 2, 100);
      idle_since = internal::NowUs();
    }
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  int spin_us_ = 0;
  std::string address_;
  Fd wake_;
  std::atomic<bool> stop_{false};
  std::atomic<int> waiters_{0};
  std::thread thread_;
};

class UcxEngine final : public internal::EngineBase {
 public:
  explicit UcxEngine(const TransportOptions& options) : EngineBase("ucx"), options_(options) {}

  absl::Status Start() {
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

  ~UcxEngine() override {
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

  std::vector<std::string> LocalAddresses() const override { return {address_}; }

  Capabilities GetCapabilities() const override {
    Capabilities c;
    c.backend = "ucx";
    c.peer_events = true;
    c.hung_peer_detection = true;
    c.cross_process = true;
    return c;
  }

  absl::Status Connect(const PeerRef& ref) override { return GetPeer(ref).status(); }

 protected:
  // Managed buffers are allocated by UCX, so that its shared-memory transports (posix, sysv)
  // can map them into readers directly, as ucx_perftest's buffers are; user memory registered
  // with RegisterMemory is mapped as it is (cma or software RMA on this host, RDMA elsewhere).
  absl::StatusOr<Backing> AllocateBacking(size_t length) override {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = nullptr;
    mp.length = length;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    void* rkey = nullptr;
    size_t rkey_len = 0;
    ucp_mem_attr_t attr{};
    {
      MutexLock lock(&worker_.mu);
      ucs_status_t st = ucp_mem_map(worker_.context(), &mp, &memh);
      if (st != UCS_OK) {
        return absl::ResourceExhaustedError(
            StrCat("ucx: cannot allocate ", length, " bytes: ", ucs_status_string(st)));
      }
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
      st = ucp_mem_query(memh, &attr);
      if (st == UCS_OK) st = ucp_rkey_pack(worker_.context(), memh, &rkey, &rkey_len);
      if (st != UCS_OK) {
        ucp_mem_unmap(worker_.context(), memh);
        return UcsError("allocate", st);
      }
    }
    MemoryKey key{memh, std::string(static_cast<char*>(rkey), rkey_len)};
    {
      MutexLock lock(&worker_.mu);
      ucp_rkey_buffer_release(rkey);
    }
    MutexLock lock(&keys_mu_);
    keys_[reinterpret_cast<uint64_t>(attr.address)] = std::move(key);
    return Backing{attr.address, kUcxAllocated};
  }

  // The memory went with ucp_mem_unmap in OnUnregister.
  void FreeBacking(void* addr, size_t length, uint64_t cookie) override {
    if (cookie != kUcxAllocated) EngineBase::FreeBacking(addr, length, cookie);
  }

  absl::Status OnRegister(internal::RegionTable::Region& region) override {
    if (region.managed && region.cookie == kUcxAllocated) return absl::OkStatus();  // mapped
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = reinterpret_cast<void*>(region.base);
    mp.length = region.length;
    ucp_mem_h memh = nullptr;
    void* rkey = nullptr;
    size_t rkey_len = 0;
    {
      MutexLock lock(&worker_.mu);
      ucs_status_t st = ucp_mem_map(worker_.context(), &mp, &memh);
      if (st != UCS_OK) {
        return absl::InvalidArgumentError(StrCat("ucx: cannot map ",
                                                 internal::RangeString(region.base, region.length),
                                                 ": ", ucs_status_string(st)));
      }
      st = ucp_rkey_pack(worker_.context(), memh, &rkey, &rkey_len);
      if (st != UCS_OK) {
        ucp_mem_unmap(worker_.context(), memh);
        return UcsError("rkey pack", st);
      }
    }
    MemoryKey key{memh, std::string(static_cast<char*>(rkey), rkey_len)};
    {
      MutexLock lock(&worker_.mu);
      ucp_rkey_buffer_release(rkey);
    }
    MutexLock lock(&keys_mu_);
    keys_[region.base] = std::move(key);
    return absl::OkStatus();
  }

  void OnUnregister(const internal::RegionTable::Region& region) override {
    // Tell every reader to drop its rkey for the range and wait for their acks, so that no get
    // touches the memory once we return (bounded by suspect_ms for a hung reader).
    std::vector<std::shared_ptr<ControlConn>> controls;
    {
      MutexLock lock(&server_mu_);
      for (auto& c : controls_) controls.push_back(c);
    }
    for (auto& c : controls) {
      MutexLock lock(&c->mu);
      if (c->closed) continue;
      ++c->invalidations_sent;
      if (!internal::SendFrame(c->fd, internal::MakeFrame(FrameType::kInvalidate, region.base))
               .ok()) {
        c->closed = true;
      }
    }
    for (auto& c : controls) {
      MutexLock lock(&c->mu);
      auto acked = [&c]() { return c->closed || c->invalidations_acked >= c->invalidations_sent; };
      c->mu.AwaitWithTimeout(absl::Condition(&acked), absl::Milliseconds(options_.suspect_ms));
    }
    MemoryKey key;
    {
      MutexLock lock(&keys_mu_);
      auto it = keys_.find(region.base);
      if (it == keys_.end()) return;
      key = std::move(it->second);
      keys_.erase(it);
    }
    MutexLock lock(&worker_.mu);
    ucp_mem_unmap(worker_.context(), key.memh);
  }

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
    Fd data ABSL_GUARDED_BY(data_mu);
    internal::SharedMutex rkey_mu;
    std::map<uint64_t, CachedRkey> rkeys ABSL_GUARDED_BY(rkey_mu);  // by base
    uint64_t invalidations ABSL_GUARDED_BY(rkey_mu) = 0;
    ~Peer() {
      MutexLock lock(&engine->worker_.mu);
      for (auto& [base, r] : rkeys) ucp_rkey_destroy(r.rkey);
      if (ep != nullptr) CloseEpLocked();
    }
    void CloseEpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine->worker_.mu) {
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
  };
  // The server's view of a reader's control connection (INVALIDATE goes out on it).
  struct ControlConn {
    int fd = -1;
    Mutex mu;
    bool closed = false;
    uint64_t invalidations_sent = 0;
    uint64_t invalidations_acked = 0;
  };

  // True when every lane of `ep` is one of UCX's shared-memory transports, which hold no
  // connection to the peer (from ucp_ep_print_info: "lane[0]:  3:sysv/memory.0 ...").
  static bool SharedMemoryOnly(ucp_ep_h ep) {
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
      if (transport != "sysv" && transport != "posix" && transport != "cma" &&
          transport != "knem" && transport != "xpmem") {
        return false;
      }
      ++lanes;
    }
    return lanes > 0;
  }

  // Closes a new endpoint to a live peer with a flush (no force), up to `timeout_ms`.
  void CloseQuietlyLocked(ucp_ep_h ep, int timeout_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(worker_.mu) {
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

  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    if (peer->live != nullptr) {
      peer->engine->watch_->ReportDead(peer->live,
                                       StrCat("endpoint error: ", ucs_status_string(status)));
    }
  }

  // Progresses until `req` completes. If the peer dies or is suspected meanwhile, the endpoint
  // is closed by force so that the request completes (with an error) instead of hanging. An
  // endpoint without peer error handling may leave a request that needs the dead peer's help
  // (UCX's tcp transport emulates gets) in progress for ever: one slice after the close, the
  // request is abandoned (UCX frees it should it ever complete; its endpoint is gone, so
  // nothing writes into `local` any more).
  ucs_status_t WaitFor(Peer& peer, void* req) {
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

  static ucp_rkey_h LookupRkey(Peer& peer, uint64_t addr, uint64_t length)
      ABSL_SHARED_LOCKS_REQUIRED(peer.rkey_mu) {
    auto it = peer.rkeys.upper_bound(addr);
    if (it == peer.rkeys.begin()) return nullptr;
    --it;
    if (addr >= it->second.base && addr + length >= addr &&
        addr + length <= it->second.base + it->second.length) {
      return it->second.rkey;
    }
    return nullptr;
  }

  // Asks the owner for the rkey of the region that holds the range and caches it, unless an
  // invalidation arrived since `seen` (then the caller looks again).
  absl::Status FetchRkey(Peer& peer, const PeerRef& ref, uint64_t addr, uint64_t length,
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

  void HandleInvalidate(Peer* peer, int fd, const FrameHeader& h) {
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

  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const PeerRef& ref) {
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
    absl::Status s =
        internal::SendFrame(data.get(), internal::MakeFrame(FrameType::kWorkerAddress));
    if (s.ok()) {
      int64_t deadline = internal::NowUs() + int64_t{options_.connect_timeout_ms} * 1000;
      s = internal::RecvFrame(data.get(), &h, &worker_address, 0, kSliceMs, [deadline]() {
        return internal::NowUs() > deadline ? absl::UnavailableError("timed out")
                                            : absl::OkStatus();
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

  absl::StatusOr<Fd> Dial(const internal::HostPort& hp, const Lid& lid,
                          internal::ChannelKind kind) {
    std::string where = StrCat(lid.ToString(), " at ucx://", hp.host, ":", hp.port);
    absl::StatusOr<Fd> fd = internal::ConnectTcp(hp.host, hp.port, options_.connect_timeout_ms);
    if (!fd.ok()) {
      return absl::UnavailableError(
          StrCat("ucx: cannot reach ", where, ": ", fd.status().message()));
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

  // ---- server side (the side channel) ----

  void Serve(int fd) {
    std::string client;
    absl::StatusOr<internal::ChannelKind> kind =
        internal::ServerHandshake(fd, options_.local_lid, options_.connect_timeout_ms, &client);
    std::shared_ptr<ControlConn> control;
    if (kind.ok() && *kind == internal::ChannelKind::kControl) {
      internal::TuneTcp(fd, 0);
      control = std::make_shared<ControlConn>();
      control->fd = fd;
      MutexLock lock(&server_mu_);
      controls_.push_back(control);
    }
    internal::AbortCheck abort = [this]() {
      return stopping_ ? absl::CancelledError("stopping") : absl::OkStatus();
    };
    while (kind.ok()) {
      FrameHeader h;
      if (!internal::RecvFrame(fd, &h, nullptr, 0, kSliceMs, abort).ok()) break;
      absl::Status s;
      switch (static_cast<FrameType>(h.type)) {
        case FrameType::kPing: {
          if (control == nullptr) {
            s = absl::InvalidArgumentError("PING on a data channel");
            break;
          }
          MutexLock lock(&control->mu);
          s = internal::SendFrame(fd, internal::MakeFrame(FrameType::kPong));
          break;
        }
        case FrameType::kInvalidateAck: {
          if (control == nullptr) {
            s = absl::InvalidArgumentError("ack on a data channel");
            break;
          }
          MutexLock lock(&control->mu);
          ++control->invalidations_acked;
          break;
        }
        case FrameType::kWorkerAddress:
          s = internal::SendFrame(
              fd, internal::MakeFrame(FrameType::kWorkerAddressInfo, internal::HostId()),
              worker_.address());
          break;
        case FrameType::kRkey: {
          absl::StatusOr<internal::RegionTable::Pin> pin = regions().Acquire(
              h.a, h.b, StrCat("ucx: read of ", options_.local_lid.ToString(), ": remote"));
          if (!pin.ok()) {
            s = internal::SendError(fd, pin.status());
            break;
          }
          std::string packed;
          {
            MutexLock lock(&keys_mu_);
            auto it = keys_.find(pin->region().base);
            if (it != keys_.end()) packed = it->second.packed;
          }
          if (packed.empty()) {
            s = internal::SendError(fd, absl::InvalidArgumentError("ucx: range not mapped"));
          } else {
            s = internal::SendFrame(
                fd,
                internal::MakeFrame(FrameType::kRkeyInfo, pin->region().base, pin->region().length),
                packed);
          }
          break;
        }
        default:
          s = absl::InvalidArgumentError("unexpected frame");
      }
      if (!s.ok()) break;
    }
    if (control != nullptr) {
      MutexLock lock(&server_mu_);
      controls_.remove(control);
      MutexLock cl(&control->mu);
      control->closed = true;
    }
  }

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

}  // namespace

absl::StatusOr<TransferEnginePtr> CreateUcxEngine(const TransportOptions& options) {
  auto engine = std::make_unique<UcxEngine>(options);
  CONNEX_RETURN_IF_ERROR(engine->Start());
  return engine;
}

}  // namespace connex::transport::ucx
