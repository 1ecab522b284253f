// The `mem` transport: engines in one process attached to a shared in-process Fabric, with
// fault injection (kill, partition, delay, drop, failed reads, duplicated and spurious events,
// restart under the same LID). The step protocol's unit tests run on it. Deterministic given
// the fabric's seed and the order of reads. Fabric and engines are thread-safe.
#ifndef CONNEX_TRANSPORT_MEM_MEM_ENGINE_H_
#define CONNEX_TRANSPORT_MEM_MEM_ENGINE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "connex/base/clock.h"
#include "connex/base/lid.h"
#include "connex/base/mutex.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport::mem {

class MemEngine;

struct FabricOptions {
  uint64_t seed = 1;  // seeds the drop RNG
  // A read across a partition waits this long for a Heal, then fails Unavailable.
  int partition_timeout_ms = 200;
  // Time source for suspicion (kSuspected after the watcher's suspect_ms of partition). Not
  // owned; must outlive the fabric.
  Clock* clock = RealClock::Get();
};

// The in-process "network". Engines attach on creation (TransportOptions::fabric) and detach on
// destruction, which their peers see as a peer death (like a closed socket).
//
// Faults and what a reader sees:
//   Kill(lid)         the process is gone: its memory can no longer be read (Unavailable), its
//                     own reads fail, every engine connected to it gets kDead. A new engine with
//                     the same LID is a restart: new address (incarnation), old one stays dead.
//   Partition(a, b)   the link is cut both ways: reads wait up to partition_timeout_ms for a
//                     Heal and then fail Unavailable; after the watcher's suspect_ms of
//                     partition it gets kSuspected; Heal brings kConnected.
//   SetReadDelay      reads of an owner's memory take at least that long (a slow link).
//   SetDropRate       that fraction of reads fails Unavailable ("dropped"), drawn from a seeded
//                     RNG, as a lost request would after a timeout.
//   FailNextReads     the next n reads of an owner's memory fail with a chosen code.
//   SetDuplicateEvents every peer event is delivered twice (subscribers must be idempotent).
//   InjectEvent       delivers a spurious event (e.g. kDead of a live peer, or a second
//                     kConnected, as a spurious reconnect would); reads are not affected.
// A one-sided read has no message to duplicate, so duplication applies to events only.
class Fabric {
 public:
  static std::shared_ptr<Fabric> Create(FabricOptions options = {});
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  void Kill(const Lid& lid);
  void Partition(const Lid& a, const Lid& b);
  void Heal(const Lid& a, const Lid& b);
  void HealAll();
  // 0 clears. Applies to reads of `owner`'s memory.
  void SetReadDelay(const Lid& owner, int delay_ms);
  // `fraction` in [0, 1] of reads (of `owner`'s memory, or of everyone's when nullopt) fail.
  void SetDropRate(double fraction, std::optional<Lid> owner = std::nullopt);
  void FailNextReads(const Lid& owner, int count,
                     absl::StatusCode code = absl::StatusCode::kUnavailable);
  void SetDuplicateEvents(bool duplicate);
  // Delivers `event` to the live engine of `watcher` as if its transport had produced it.
  void InjectEvent(const Lid& watcher, PeerEvent event);

  bool IsAlive(const Lid& lid) const;
  uint64_t reads_started() const;
  uint64_t reads_dropped() const;

 private:
  friend class MemEngine;
  explicit Fabric(FabricOptions options);

  struct Node {
    Lid lid;
    MemEngine* engine = nullptr;  // null once detached
    bool alive = true;
    int suspect_ms = 1000;
    int active_reads = 0;         // reads that use this node's memory or run on its behalf
    std::set<uint64_t> watchers;  // incarnations connected to this node
    absl::flat_hash_map<Lid, uint64_t> connected;  // this node's connections, by peer LID
  };
  struct Partitioned {
    int64_t since_ms = 0;
    std::set<uint64_t> suspecting;  // watcher incarnations that got kSuspected
  };

  // MemEngine's side.
  uint64_t Attach(MemEngine* engine, const Lid& lid, int suspect_ms);
  void Detach(uint64_t incarnation);
  // Connects `reader` to the node at `address`; returns its incarnation.
  absl::StatusOr<uint64_t> ConnectLocked(uint64_t reader, const Lid& lid,
                                         const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Connect(uint64_t reader, const Lid& lid, const std::string& address);
  absl::Status Read(uint64_t reader, const Lid& lid, const std::string& address, void* local,
                    uint64_t remote_addr, size_t length);
  std::string AddressOf(uint64_t incarnation) const;
  std::string AddressOfLocked(uint64_t incarnation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void PublishLocked(uint64_t watcher, PeerEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDeadLocked(uint64_t incarnation, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PartitionedLocked(const Lid& a, const Lid& b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TickLoop();

  const FabricOptions options_;
  const uint64_t id_;
  mutable Mutex mu_;
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Node> nodes_ ABSL_GUARDED_BY(mu_);              // by incarnation
  absl::flat_hash_map<Lid, uint64_t> current_ ABSL_GUARDED_BY(mu_);  // LID → latest incarnation
  std::map<std::pair<Lid, Lid>, Partitioned> partitions_ ABSL_GUARDED_BY(mu_);  // (min, max)
  absl::flat_hash_map<Lid, int> delay_ms_ ABSL_GUARDED_BY(mu_);
  std::optional<double> drop_all_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Lid, double> drop_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Lid, std::pair<int, absl::StatusCode>> fail_next_ ABSL_GUARDED_BY(mu_);
  bool duplicate_events_ ABSL_GUARDED_BY(mu_) = false;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  uint64_t reads_started_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reads_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;
};

// Creates a mem engine attached to `options.fabric` (InvalidArgument when it is null).
absl::StatusOr<TransferEnginePtr> CreateMemEngine(const TransportOptions& options);

}  // namespace connex::transport::mem

#endif  // CONNEX_TRANSPORT_MEM_MEM_ENGINE_H_
