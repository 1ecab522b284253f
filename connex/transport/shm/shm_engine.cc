#include "connex/transport/shm/shm_engine.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/internal/address.h"
#include "connex/transport/internal/connection_server.h"
#include "connex/transport/internal/engine_base.h"
#include "connex/transport/internal/one_sided.h"
#include "connex/transport/internal/peer_watch.h"
#include "connex/transport/internal/socket.h"

namespace connex::transport::shm {
namespace {

using internal::Fd;
using internal::FrameHeader;
using internal::FrameType;

constexpr int kSlots = 1024;
constexpr uint64_t kTableMagic = 0x31424154584e43ULL;  // "CNXTAB1"
constexpr int kSliceMs = 50;
std::atomic<int> next_engine_index{1};

// The owner's registered ranges, in a shared segment that readers map read-only. Each slot is a
// seqlock: `seq` is odd while the owner rewrites the slot, and changes whenever the range is
// registered or unregistered, so a reader can tell that a range went away during its copy.
struct Slot {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> base;
  std::atomic<uint64_t> length;      // 0: free slot
  std::atomic<uint64_t> segment;     // 0: not shared memory (read with process_vm_readv)
  std::atomic<uint64_t> seg_offset;  // offset of `base` in the segment
};
struct Table {
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> pid;
  std::atomic<uint64_t> high_water;  // slots [0, high_water) may be in use
  Slot slots[kSlots];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct Segment {
  Fd fd;
  void* addr = nullptr;
  size_t length = 0;
};

struct Mapping {
  const uint8_t* addr = nullptr;
  size_t length = 0;
};

absl::StatusOr<Segment> CreateSegment(size_t length, int prot) {
  Segment s;
  s.fd.reset(memfd_create("connex-shm", MFD_CLOEXEC));
  if (!s.fd.valid()) {
    return absl::ResourceExhaustedError(StrCat("shm: memfd_create: ", std::strerror(errno)));
  }
  if (ftruncate(s.fd.get(), static_cast<off_t>(length)) != 0) {
    return absl::ResourceExhaustedError(
        StrCat("shm: cannot size a segment to ", length, " bytes: ", std::strerror(errno)));
  }
  s.addr = mmap(nullptr, length, prot, MAP_SHARED, s.fd.get(), 0);
  if (s.addr == MAP_FAILED) {
    return absl::ResourceExhaustedError(StrCat("shm: mmap: ", std::strerror(errno)));
  }
  s.length = length;
  return s;
}

class ShmEngine final : public internal::EngineBase {
 public:
  explicit ShmEngine(const TransportOptions& options) : EngineBase("shm"), options_(options) {}

  absl::Status Start() {
    ReapStaleSockets(options_.shm_dir);
    CONNEX_ASSIGN_OR_RETURN(Segment table, CreateSegment(sizeof(Table), PROT_READ | PROT_WRITE));
    table_ = static_cast<Table*>(table.addr);
    table_->magic = kTableMagic;
    table_->pid = static_cast<uint64_t>(getpid());
    table_->high_water = 0;
    {
      MutexLock lock(&seg_mu_);
      segments_[0] = std::move(table);  // segment 0 is the table
    }
    path_ = StrCat(options_.shm_dir, "/connex-", getpid(), "-", next_engine_index.fetch_add(1),
                   ".sock");
    CONNEX_ASSIGN_OR_RETURN(Fd listen, internal::ListenUnix(path_));
    address_ = StrCat("shm://", internal::HostName(), path_);
    watch_ = std::make_unique<internal::PeerWatch>(events(), "shm", options_.heartbeat_ms,
                                                   options_.suspect_ms);
    server_ = std::make_unique<internal::ConnectionServer>("shm", std::move(listen),
                                                           [this](int fd) { Serve(fd); });
    return absl::OkStatus();
  }

  ~ShmEngine() override {
    stopping_ = true;
    if (server_ != nullptr) server_->Stop();
    if (!path_.empty()) unlink(path_.c_str());
    {
      MutexLock lock(&mu_);
      peers_.clear();
    }
    watch_.reset();
    FreeAllManagedBuffers();
    MutexLock lock(&seg_mu_);
    for (auto& [id, seg] : segments_) munmap(seg.addr, seg.length);
  }

  absl::Status TransferSyncRead(const PeerRef& ref, void* local, uint64_t remote_addr,
                                size_t length) override {
    if (length == 0) return absl::OkStatus();
    CONNEX_ASSIGN_OR_RETURN(
        internal::RegionTable::Pin pin,
        regions().Acquire(reinterpret_cast<uint64_t>(local), length, "shm: read: local"));
    CONNEX_ASSIGN_OR_RETURN(std::shared_ptr<Peer> peer, GetPeer(ref));
    auto dead = [&]() {
      return absl::UnavailableError(
          StrCat("shm: peer ", ref.lid.ToString(), " at ", peer->live->address, " is dead"));
    };
    if (peer->live->dead) return dead();
    const std::string range = internal::RangeString(remote_addr, length);
    // Find the slot that holds the range, consistently (seqlock).
    const Slot* slot = nullptr;
    uint64_t seq = 0, base = 0, segment = 0, seg_offset = 0;
    const uint64_t high = std::min<uint64_t>(peer->table->high_water.load(), kSlots);
    for (uint64_t i = 0; i < high && slot == nullptr; ++i) {
      const Slot& s = peer->table->slots[i];
      for (int attempt = 0; attempt < 1000; ++attempt) {
        uint64_t s1 = s.seq.load(std::memory_order_acquire);
        if (s1 & 1) continue;
        uint64_t b = s.base.load(std::memory_order_relaxed);
        uint64_t len = s.length.load(std::memory_order_relaxed);
        uint64_t seg = s.segment.load(std::memory_order_relaxed);
        uint64_t off = s.seg_offset.load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (s.seq.load(std::memory_order_relaxed) != s1) continue;
        if (len != 0 && remote_addr >= b && remote_addr + length >= remote_addr &&
            remote_addr + length <= b + len) {
          slot = &s;
          seq = s1;
          base = b;
          segment = seg;
          seg_offset = off;
        }
        break;
      }
    }
    if (slot == nullptr) {
      return absl::InvalidArgumentError(StrCat("shm: read of ", ref.lid.ToString(),
                                               ": remote range ", range, " is not registered"));
    }
    if (segment != 0) {
      CONNEX_ASSIGN_OR_RETURN(Mapping m, MapSegment(*peer, segment));
      uint64_t offset = seg_offset + (remote_addr - base);
      if (offset + length > m.length) {
        return absl::InvalidArgumentError(StrCat("shm: read of ", ref.lid.ToString(),
                                                 ": remote range ", range,
                                                 " lies outside its segment"));
      }
      internal::OneSidedCopy(local, m.addr + offset, length);
    } else {
      CONNEX_RETURN_IF_ERROR(ReadOtherProcess(*peer, ref, local, remote_addr, length));
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot->seq.load(std::memory_order_relaxed) != seq) {
      return absl::InvalidArgumentError(StrCat("shm: read of ", ref.lid.ToString(),
                                               ": remote range ", range,
                                               " was unregistered during the read"));
    }
    if (peer->live->dead) return dead();
    return absl::OkStatus();
  }

  std::vector<std::string> LocalAddresses() const override { return {address_}; }

  Capabilities GetCapabilities() const override {
    Capabilities c;
    c.backend = "shm";
    c.peer_events = true;
    c.hung_peer_detection = true;
    c.same_host_only = true;
    c.cross_process = true;
    return c;
  }

  absl::Status Connect(const PeerRef& ref) override { return GetPeer(ref).status(); }

 protected:
  absl::StatusOr<Backing> AllocateBacking(size_t length) override {
    CONNEX_ASSIGN_OR_RETURN(Segment seg, CreateSegment(length, PROT_READ | PROT_WRITE));
    MutexLock lock(&seg_mu_);
    uint64_t id = next_segment_++;
    void* addr = seg.addr;
    segments_[id] = std::move(seg);
    return Backing{addr, id};
  }

  void FreeBacking(void* addr, size_t length, uint64_t cookie) override {
    MutexLock lock(&seg_mu_);
    munmap(addr, length);
    segments_.erase(cookie);  // closes the fd; readers keep their own mappings
  }

  absl::Status OnRegister(internal::RegionTable::Region& region) override {
    MutexLock lock(&table_mu_);
    int free_slot = -1;
    for (int i = 0; i < kSlots; ++i) {
      if (table_->slots[i].length.load(std::memory_order_relaxed) == 0 &&
          !slot_of_.contains_value(i)) {
        free_slot = i;
        break;
      }
    }
    if (free_slot < 0) {
      return absl::ResourceExhaustedError(StrCat("shm: more than ", kSlots, " registered ranges"));
    }
    Slot& s = table_->slots[free_slot];
    s.seq.fetch_add(1, std::memory_order_acq_rel);  // odd: being written
    s.base.store(region.base, std::memory_order_relaxed);
    s.segment.store(region.managed ? region.cookie : 0, std::memory_order_relaxed);
    s.seg_offset.store(0, std::memory_order_relaxed);
    s.length.store(region.length, std::memory_order_relaxed);
    s.seq.fetch_add(1, std::memory_order_release);
    slot_of_.set(region.base, free_slot);
    if (static_cast<uint64_t>(free_slot) >= table_->high_water.load()) {
      table_->high_water.store(free_slot + 1, std::memory_order_release);
    }
    return absl::OkStatus();
  }

  void OnUnregister(const internal::RegionTable::Region& region) override {
    MutexLock lock(&table_mu_);
    int i = slot_of_.take(region.base);
    if (i < 0) return;
    Slot& s = table_->slots[i];
    s.seq.fetch_add(1, std::memory_order_acq_rel);
    s.length.store(0, std::memory_order_relaxed);
    s.seq.fetch_add(1, std::memory_order_release);
  }

 private:
  // base → slot, small helper so that the table mutex guards both.
  struct SlotIndex {
    absl::flat_hash_map<uint64_t, int> by_base;
    std::vector<bool> used = std::vector<bool>(kSlots, false);
    bool contains_value(int i) const { return used[i]; }
    void set(uint64_t base, int i) {
      by_base[base] = i;
      used[i] = true;
    }
    int take(uint64_t base) {
      auto it = by_base.find(base);
      if (it == by_base.end()) return -1;
      int i = it->second;
      by_base.erase(it);
      used[i] = false;
      return i;
    }
  };

  struct Peer {
    Lid lid;
    std::string path;
    std::shared_ptr<internal::Liveness> live;
    pid_t pid = 0;
    const Table* table = nullptr;
    Mutex mu;
    Fd data ABSL_GUARDED_BY(mu);  // segment requests
    absl::flat_hash_map<uint64_t, Mapping> maps ABSL_GUARDED_BY(mu);
    ~Peer() {
      if (table != nullptr) munmap(const_cast<Table*>(table), sizeof(Table));
      MutexLock lock(&mu);
      for (auto& [id, m] : maps) munmap(const_cast<uint8_t*>(m.addr), m.length);
    }
  };

  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const PeerRef& ref) {
    std::optional<std::string> where = internal::FindAddress(ref.addresses, "shm");
    if (!where) {
      return absl::InvalidArgumentError(
          StrCat("shm: peer ", ref.lid.ToString(), " publishes no shm:// address"));
    }
    {
      MutexLock lock(&mu_);
      auto it = peers_.find(ref.lid);
      if (it != peers_.end() && it->second->path == *where && !it->second->live->dead) {
        return it->second;
      }
    }
    size_t slash = where->find('/');
    if (slash == std::string::npos || where->substr(0, slash) != internal::HostName()) {
      return absl::UnavailableError(StrCat("shm: peer ", ref.lid.ToString(), " at shm://", *where,
                                           " is not on this host (", internal::HostName(), ")"));
    }
    std::string path = where->substr(slash);
    auto peer = std::make_shared<Peer>();
    peer->lid = ref.lid;
    peer->path = *where;
    CONNEX_ASSIGN_OR_RETURN(Fd control, Dial(path, ref.lid, internal::ChannelKind::kControl));
    CONNEX_ASSIGN_OR_RETURN(Fd data, Dial(path, ref.lid, internal::ChannelKind::kData));
    {
      MutexLock lock(&peer->mu);
      peer->data = std::move(data);
    }
    CONNEX_ASSIGN_OR_RETURN(Mapping table, MapSegment(*peer, 0));
    peer->table = reinterpret_cast<const Table*>(table.addr);
    {
      MutexLock lock(&peer->mu);
      peer->maps.erase(0);  // owned through peer->table
    }
    if (table.length < sizeof(Table) || peer->table->magic.load() != kTableMagic) {
      return absl::UnavailableError(StrCat("shm: ", path, " sent a malformed region table"));
    }
    peer->pid = static_cast<pid_t>(peer->table->pid.load());
    MutexLock lock(&mu_);
    auto& slot = peers_[ref.lid];
    if (slot != nullptr && slot->path == *where && !slot->live->dead) return slot;
    if (slot != nullptr) watch_->Unwatch(slot->live);
    peer->live = watch_->Watch(std::move(control), ref.lid, StrCat("shm://", *where));
    slot = peer;
    return peer;
  }

  absl::StatusOr<Fd> Dial(const std::string& path, const Lid& lid, internal::ChannelKind kind) {
    absl::StatusOr<Fd> fd = internal::ConnectUnix(path, options_.connect_timeout_ms);
    if (!fd.ok()) {
      return absl::UnavailableError(
          StrCat("shm: cannot reach ", lid.ToString(), " at ", path, ": ", fd.status().message()));
    }
    absl::Status s = internal::ClientHandshake(fd->get(), kind, options_.local_lid, lid,
                                               options_.connect_timeout_ms);
    if (!s.ok()) {
      return absl::Status(
          s.code() == absl::StatusCode::kFailedPrecondition ? s.code()
                                                            : absl::StatusCode::kUnavailable,
          StrCat("shm: handshake with ", lid.ToString(), " at ", path, ": ", s.message()));
    }
    return fd;
  }

  // The reader's mapping of the peer's segment `id`, asked for over the data socket once.
  absl::StatusOr<Mapping> MapSegment(Peer& peer, uint64_t id) {
    MutexLock lock(&peer.mu);
    auto it = peer.maps.find(id);
    if (it != peer.maps.end()) return it->second;
    if (!peer.data.valid()) return absl::UnavailableError("shm: peer connection lost");
    absl::Status s =
        internal::SendFrame(peer.data.get(), internal::MakeFrame(FrameType::kSegment, id));
    FrameHeader h;
    Fd fd;
    if (s.ok())
      s = internal::RecvFrameWithFd(peer.data.get(), &h, &fd, options_.connect_timeout_ms);
    if (!s.ok()) {
      peer.data.reset();
      return absl::UnavailableError(
          StrCat("shm: segment request to ", peer.lid.ToString(), ": ", s.message()));
    }
    if (h.type == static_cast<uint16_t>(FrameType::kError)) {
      // The error text follows the header on the stream.
      std::string msg(h.payload, '\0');
      if (h.payload > 0 && h.payload <= internal::kMaxFramePayload) {
        s = internal::RecvAll(peer.data.get(), msg.data(), msg.size(), 0, kSliceMs, nullptr);
        if (!s.ok()) peer.data.reset();
      }
      return internal::StatusFromErrorFrame(h, msg);
    }
    if (h.type != static_cast<uint16_t>(FrameType::kSegmentFd) || !fd.valid() || h.a != id) {
      peer.data.reset();
      return absl::UnavailableError(StrCat("shm: bad segment reply from ", peer.lid.ToString()));
    }
    // Not MAP_POPULATE: populating a whole peer segment (a 128 MiB send ring by default)
    // allocated every page the owner had not touched yet, and cost ~100 ms at the first read
    // from a new peer — on the path of a failover (bench_handover shm: 200 -> 90 ms). Pages
    // now fault in on first use, once per mapping.
    void* addr = mmap(nullptr, h.b, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (addr == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          StrCat("shm: mmap of a peer segment: ", std::strerror(errno)));
    }
    Mapping m{static_cast<const uint8_t*>(addr), h.b};
    peer.maps[id] = m;
    return m;
  }

  // Registered memory that is not a managed (shared) buffer: one copy by the kernel.
  absl::Status ReadOtherProcess(Peer& peer, const PeerRef& ref, void* local, uint64_t remote,
                                size_t length) {
    size_t done = 0;
    while (done < length) {
      iovec l{static_cast<char*>(local) + done, length - done};
      iovec r{reinterpret_cast<void*>(remote + done), length - done};
      ssize_t n = process_vm_readv(peer.pid, &l, 1, &r, 1, 0);
      if (n <= 0) {
        if (errno == ESRCH || peer.live->dead) {
          return absl::UnavailableError(StrCat("shm: peer ", ref.lid.ToString(), " is dead"));
        }
        if (errno == EPERM) {
          return absl::InvalidArgumentError(StrCat(
              "shm: read of ", ref.lid.ToString(), ": remote range ",
              internal::RangeString(remote, length),
              " is not shared memory (use AllocateManagedBuffer) and process_vm_readv is not "
              "permitted here"));
        }
        return absl::InvalidArgumentError(
            StrCat("shm: read of ", ref.lid.ToString(), ": remote range ",
                   internal::RangeString(remote, length), ": ", std::strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  // ---- server side ----

  void Serve(int fd) {
    std::string client;
    if (internal::ServerHandshake(fd, options_.local_lid, options_.connect_timeout_ms, &client)
            .ok()) {
      internal::AbortCheck abort = [this]() {
        return stopping_ ? absl::CancelledError("stopping") : absl::OkStatus();
      };
      while (true) {
        FrameHeader h;
        if (!internal::RecvFrame(fd, &h, nullptr, 0, kSliceMs, abort).ok()) break;
        absl::Status s;
        if (h.type == static_cast<uint16_t>(FrameType::kPing)) {
          s = internal::SendFrame(fd, internal::MakeFrame(FrameType::kPong));
        } else if (h.type == static_cast<uint16_t>(FrameType::kSegment)) {
          MutexLock lock(&seg_mu_);
          auto it = segments_.find(h.a);
          if (it == segments_.end()) {
            s = internal::SendError(fd, absl::InvalidArgumentError(
                                            StrCat("shm: segment ", h.a, " of ",
                                                   options_.local_lid.ToString(), " was freed")));
          } else {
            s = internal::SendFrameWithFd(
                fd, internal::MakeFrame(FrameType::kSegmentFd, h.a, it->second.length),
                it->second.fd.get());
          }
        } else {
          s = absl::InvalidArgumentError("unexpected frame");
        }
        if (!s.ok()) break;
      }
    }
  }

  const TransportOptions options_;
  std::string path_;
  std::string address_;
  std::unique_ptr<internal::PeerWatch> watch_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<internal::ConnectionServer> server_;

  Mutex table_mu_;
  Table* table_ = nullptr;  // segments_[0]; slots written under table_mu_
  SlotIndex slot_of_ ABSL_GUARDED_BY(table_mu_);

  Mutex seg_mu_;
  uint64_t next_segment_ ABSL_GUARDED_BY(seg_mu_) = 1;
  absl::flat_hash_map<uint64_t, Segment> segments_ ABSL_GUARDED_BY(seg_mu_);

  Mutex mu_;
  absl::flat_hash_map<Lid, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int ReapStaleSockets(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  int reaped = 0;
  while (dirent* e = readdir(d)) {
    std::string_view name = e->d_name;
    // connex-<pid>-<n>.sock
    if (name.rfind("connex-", 0) != 0 || name.size() < 13 ||
        name.substr(name.size() - 5) != ".sock") {
      continue;
    }
    std::string_view rest = name.substr(7);
    size_t dash = rest.find('-');
    int pid = 0;
    if (dash == std::string_view::npos || !absl::SimpleAtoi(AsAbsl(rest.substr(0, dash)), &pid) ||
        pid <= 0 || pid == getpid()) {
      continue;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) {
      std::string path = StrCat(dir, "/", name);
      if (unlink(path.c_str()) == 0) ++reaped;
    }
  }
  closedir(d);
  if (reaped > 0) CONNEX_LOG_INFO("shm: removed {} stale socket(s) of dead processes", reaped);
  return reaped;
}

absl::StatusOr<TransferEnginePtr> CreateShmEngine(const TransportOptions& options) {
  auto engine = std::make_unique<ShmEngine>(options);
  CONNEX_RETURN_IF_ERROR(engine->Start());
  return engine;
}

}  // namespace connex::transport::shm
