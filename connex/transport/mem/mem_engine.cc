#include "connex/transport/mem/mem_engine.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/internal/address.h"
#include "connex/transport/internal/engine_base.h"
#include "connex/transport/internal/one_sided.h"

namespace connex::transport::mem {
namespace {

std::atomic<uint64_t> next_fabric_id{1};

std::pair<Lid, Lid> Key(const Lid& a, const Lid& b) {
  return a < b ? std::make_pair(a, b) : std::make_pair(b, a);
}

}  // namespace

// A mem engine: memory and events from EngineBase, reads through the fabric.
class MemEngine final : public internal::EngineBase {
 public:
  MemEngine(std::shared_ptr<Fabric> fabric, const TransportOptions& options)
      : EngineBase("mem"), fabric_(std::move(fabric)), lid_(options.local_lid) {
    incarnation_ = fabric_->Attach(this, lid_, options.suspect_ms);
    address_ = fabric_->AddressOf(incarnation_);
  }
  ~MemEngine() override {
    fabric_->Detach(incarnation_);
    FreeAllManagedBuffers();
  }

  absl::Status TransferSyncRead(const PeerRef& peer, void* local, uint64_t remote_addr,
                                size_t length) override {
    if (length == 0) return absl::OkStatus();
    CONNEX_ASSIGN_OR_RETURN(
        internal::RegionTable::Pin pin,
        regions().Acquire(reinterpret_cast<uint64_t>(local), length, "mem: read: local"));
    CONNEX_ASSIGN_OR_RETURN(std::string address, PeerAddress(peer));
    return fabric_->Read(incarnation_, peer.lid, address, local, remote_addr, length);
  }

  std::vector<std::string> LocalAddresses() const override { return {address_}; }

  Capabilities GetCapabilities() const override {
    Capabilities c;
    c.backend = "mem";
    c.peer_events = true;
    c.hung_peer_detection = true;
    c.same_host_only = true;
    c.cross_process = false;
    return c;
  }

  absl::Status Connect(const PeerRef& peer) override {
    CONNEX_ASSIGN_OR_RETURN(std::string address, PeerAddress(peer));
    return fabric_->Connect(incarnation_, peer.lid, address);
  }

 private:
  static absl::StatusOr<std::string> PeerAddress(const PeerRef& peer) {
    std::optional<std::string> a = internal::FindAddress(peer.addresses, "mem");
    if (!a) {
      return absl::InvalidArgumentError(
          StrCat("mem: peer ", peer.lid.ToString(), " publishes no mem:// address"));
    }
    return *a;
  }

  std::shared_ptr<Fabric> fabric_;
  Lid lid_;
  uint64_t incarnation_ = 0;
  std::string address_;
};

std::shared_ptr<Fabric> Fabric::Create(FabricOptions options) {
  return std::shared_ptr<Fabric>(new Fabric(options));
}

Fabric::Fabric(FabricOptions options)
    : options_(options), id_(next_fabric_id.fetch_add(1)), rng_(options.seed) {
  ticker_ = std::thread([this] { TickLoop(); });
}

Fabric::~Fabric() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  ticker_.join();
}

std::string Fabric::AddressOf(uint64_t incarnation) const {
  MutexLock lock(&mu_);
  return AddressOfLocked(incarnation);
}

std::string Fabric::AddressOfLocked(uint64_t incarnation) const {
  return StrCat("mem://f", id_, "/", incarnation, "/", nodes_.at(incarnation).lid.ToString());
}

uint64_t Fabric::Attach(MemEngine* engine, const Lid& lid, int suspect_ms) {
  MutexLock lock(&mu_);
  uint64_t inc = next_incarnation_++;
  auto old = current_.find(lid);
  if (old != current_.end() && nodes_[old->second].alive) {
    MarkDeadLocked(old->second, "mem: replaced by a new engine with the same LID");
  }
  Node& node = nodes_[inc];
  node.lid = lid;
  node.engine = engine;
  node.suspect_ms = suspect_ms;
  current_[lid] = inc;
  return inc;
}

void Fabric::Detach(uint64_t incarnation) {
  MutexLock lock(&mu_);
  Node& node = nodes_[incarnation];
  if (node.alive) MarkDeadLocked(incarnation, "mem: engine destroyed");
  auto idle = [&node]() { return node.active_reads == 0; };
  mu_.Await(absl::Condition(&idle));
  node.engine = nullptr;
  for (auto& [lid, target] : node.connected) nodes_[target].watchers.erase(incarnation);
}

void Fabric::PublishLocked(uint64_t watcher, PeerEvent event) {
  Node& w = nodes_[watcher];
  if (!w.alive || w.engine == nullptr) return;
  if (duplicate_events_) w.engine->events().Publish(event);
  w.engine->events().Publish(std::move(event));
}

void Fabric::MarkDeadLocked(uint64_t incarnation, const std::string& detail) {
  Node& node = nodes_[incarnation];
  node.alive = false;
  std::string address = AddressOfLocked(incarnation);
  for (uint64_t w : node.watchers) {
    PublishLocked(w, PeerEvent{PeerEventKind::kDead, node.lid, address, detail});
  }
}

bool Fabric::PartitionedLocked(const Lid& a, const Lid& b) const {
  return partitions_.count(Key(a, b)) > 0;
}

absl::StatusOr<uint64_t> Fabric::ConnectLocked(uint64_t reader, const Lid& lid,
                                               const std::string& address) {
  Node& self = nodes_[reader];
  if (!self.alive) {
    return absl::UnavailableError(
        StrCat("mem: ", self.lid.ToString(), " was killed; it cannot read"));
  }
  // address = f<fabric>/<incarnation>/<lid>
  std::string_view rest = address;
  size_t slash1 = rest.find('/');
  size_t slash2 = slash1 == std::string_view::npos ? slash1 : rest.find('/', slash1 + 1);
  uint64_t fabric_id = 0, inc = 0;
  if (slash2 == std::string_view::npos || rest.empty() || rest[0] != 'f' ||
      !absl::SimpleAtoi(AsAbsl(rest.substr(1, slash1 - 1)), &fabric_id) ||
      !absl::SimpleAtoi(AsAbsl(rest.substr(slash1 + 1, slash2 - slash1 - 1)), &inc)) {
    return absl::InvalidArgumentError(StrCat("mem: malformed address mem://", address));
  }
  if (fabric_id != id_) {
    return absl::UnavailableError(
        StrCat("mem: address mem://", address, " belongs to another fabric"));
  }
  auto it = nodes_.find(inc);
  if (it == nodes_.end()) {
    return absl::UnavailableError(StrCat("mem: no endpoint at mem://", address));
  }
  Node& target = it->second;
  if (target.lid != lid) {
    return absl::FailedPreconditionError(
        StrCat("mem: mem://", address, " is ", target.lid.ToString(), ", not ", lid.ToString()));
  }
  if (!target.alive) {
    return absl::UnavailableError(
        StrCat("mem: peer ", lid.ToString(), " at mem://", address, " is dead"));
  }
  auto conn = self.connected.find(lid);
  if (conn != self.connected.end() && conn->second == inc) return inc;
  if (conn != self.connected.end()) nodes_[conn->second].watchers.erase(reader);
  self.connected[lid] = inc;
  target.watchers.insert(reader);
  PublishLocked(reader, PeerEvent{PeerEventKind::kConnected, lid, StrCat("mem://", address),
                                  "mem: connected"});
  return inc;
}

absl::Status Fabric::Connect(uint64_t reader, const Lid& lid, const std::string& address) {
  MutexLock lock(&mu_);
  return ConnectLocked(reader, lid, address).status();
}

absl::Status Fabric::Read(uint64_t reader, const Lid& lid, const std::string& address, void* local,
                          uint64_t remote_addr, size_t length) {
  MemEngine* owner = nullptr;
  uint64_t target = 0;
  int delay_ms = 0;
  {
    MutexLock lock(&mu_);
    CONNEX_ASSIGN_OR_RETURN(target, ConnectLocked(reader, lid, address));
    ++reads_started_;
    auto fail = fail_next_.find(lid);
    if (fail != fail_next_.end() && fail->second.first > 0) {
      absl::StatusCode code = fail->second.second;
      if (--fail->second.first == 0) fail_next_.erase(fail);
      return absl::Status(code,
                          StrCat("mem: read from ", lid.ToString(), " failed by fault injection"));
    }
    double drop = drop_all_.value_or(0.0);
    if (auto d = drop_.find(lid); d != drop_.end()) drop = d->second;
    if (drop > 0.0) {
      double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
      if (u < drop) {
        ++reads_dropped_;
        return absl::UnavailableError(
            StrCat("mem: read from ", lid.ToString(), " dropped (fault injection)"));
      }
    }
    const Lid& self_lid = nodes_[reader].lid;
    if (PartitionedLocked(self_lid, lid)) {
      auto healed = [this, &self_lid, &lid, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !PartitionedLocked(self_lid, lid) || !nodes_[target].alive;
      };
      mu_.AwaitWithTimeout(absl::Condition(&healed),
                           absl::Milliseconds(options_.partition_timeout_ms));
      if (PartitionedLocked(self_lid, lid) || !nodes_[target].alive) {
        return absl::UnavailableError(StrCat("mem: ", lid.ToString(), " unreachable from ",
                                             self_lid.ToString(), " (partitioned)"));
      }
    }
    if (auto d = delay_ms_.find(lid); d != delay_ms_.end()) delay_ms = d->second;
    owner = nodes_[target].engine;
    ++nodes_[target].active_reads;
    ++nodes_[reader].active_reads;
  }
  absl::Status status;
  if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  {
    MutexLock lock(&mu_);
    if (!nodes_[target].alive) {
      status =
          absl::UnavailableError(StrCat("mem: peer ", lid.ToString(), " died during the read"));
    }
  }
  if (status.ok()) {
    absl::StatusOr<internal::RegionTable::Pin> pin = owner->regions().Acquire(
        remote_addr, length, StrCat("mem: read from ", lid.ToString(), ": remote"));
    if (!pin.ok()) {
      status = pin.status();
    } else {
      internal::OneSidedCopy(local, reinterpret_cast<const void*>(remote_addr), length);
    }
  }
  MutexLock lock(&mu_);
  --nodes_[target].active_reads;
  --nodes_[reader].active_reads;
  if (status.ok() && !nodes_[target].alive) {
    status = absl::UnavailableError(StrCat("mem: peer ", lid.ToString(), " died during the read"));
  }
  return status;
}

void Fabric::Kill(const Lid& lid) {
  MutexLock lock(&mu_);
  auto it = current_.find(lid);
  if (it == current_.end() || !nodes_[it->second].alive) return;
  MarkDeadLocked(it->second, "mem: killed (fault injection)");
}

void Fabric::Partition(const Lid& a, const Lid& b) {
  MutexLock lock(&mu_);
  partitions_.emplace(Key(a, b), Partitioned{options_.clock->NowMs(), {}});
}

void Fabric::Heal(const Lid& a, const Lid& b) {
  MutexLock lock(&mu_);
  auto it = partitions_.find(Key(a, b));
  if (it == partitions_.end()) return;
  std::set<uint64_t> suspecting = std::move(it->second.suspecting);
  partitions_.erase(it);
  for (uint64_t w : suspecting) {
    const Lid& other = nodes_[w].lid == a ? b : a;
    auto cur = current_.find(other);
    if (cur == current_.end()) continue;
    PublishLocked(w, PeerEvent{PeerEventKind::kConnected, other, AddressOfLocked(cur->second),
                               "mem: partition healed"});
  }
}

void Fabric::HealAll() {
  std::vector<std::pair<Lid, Lid>> keys;
  {
    MutexLock lock(&mu_);
    for (const auto& [key, p] : partitions_) keys.push_back(key);
  }
  for (const auto& [a, b] : keys) Heal(a, b);
}

void Fabric::SetReadDelay(const Lid& owner, int delay_ms) {
  MutexLock lock(&mu_);
  if (delay_ms <= 0) {
    delay_ms_.erase(owner);
  } else {
    delay_ms_[owner] = delay_ms;
  }
}

void Fabric::SetDropRate(double fraction, std::optional<Lid> owner) {
  MutexLock lock(&mu_);
  if (owner) {
    drop_[*owner] = fraction;
  } else {
    drop_all_ = fraction;
  }
}

void Fabric::FailNextReads(const Lid& owner, int count, absl::StatusCode code) {
  MutexLock lock(&mu_);
  fail_next_[owner] = {count, code};
}

void Fabric::SetDuplicateEvents(bool duplicate) {
  MutexLock lock(&mu_);
  duplicate_events_ = duplicate;
}

void Fabric::InjectEvent(const Lid& watcher, PeerEvent event) {
  MutexLock lock(&mu_);
  auto it = current_.find(watcher);
  if (it == current_.end()) return;
  PublishLocked(it->second, std::move(event));
}

bool Fabric::IsAlive(const Lid& lid) const {
  MutexLock lock(&mu_);
  auto it = current_.find(lid);
  return it != current_.end() && nodes_.at(it->second).alive;
}

uint64_t Fabric::reads_started() const {
  MutexLock lock(&mu_);
  return reads_started_;
}

uint64_t Fabric::reads_dropped() const {
  MutexLock lock(&mu_);
  return reads_dropped_;
}

void Fabric::TickLoop() {
  MutexLock lock(&mu_);
  while (!stop_) {
    auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopped), absl::Milliseconds(5));
    if (stop_) return;
    int64_t now = options_.clock->NowMs();
    for (auto& [key, p] : partitions_) {
      for (int side = 0; side < 2; ++side) {
        const Lid& watcher_lid = side == 0 ? key.first : key.second;
        const Lid& peer_lid = side == 0 ? key.second : key.first;
        auto cur = current_.find(peer_lid);
        if (cur == current_.end()) continue;
        Node& peer = nodes_[cur->second];
        for (uint64_t w : peer.watchers) {
          Node& watcher = nodes_[w];
          if (watcher.lid != watcher_lid || !watcher.alive || p.suspecting.count(w)) continue;
          if (now - p.since_ms < watcher.suspect_ms) continue;
          p.suspecting.insert(w);
          PublishLocked(w,
                        PeerEvent{PeerEventKind::kSuspected, peer_lid, AddressOfLocked(cur->second),
                                  "mem: no heartbeat (partitioned)"});
        }
      }
    }
  }
}

absl::StatusOr<TransferEnginePtr> CreateMemEngine(const TransportOptions& options) {
  if (options.fabric == nullptr) {
    return absl::InvalidArgumentError("mem: TransportOptions.fabric is not set");
  }
  return std::make_unique<MemEngine>(options.fabric, options);
}

}  // namespace connex::transport::mem
