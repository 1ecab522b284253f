// Registry: the directory's table of records, leases, epochs and events — the state machine
// behind DirectoryServer, with no I/O so that leases, epochs and supersession are tested with a
// fake clock. Thread-compatible: the server's loop thread owns it.
#ifndef CONNEX_DIRECTORY_REGISTRY_H_
#define CONNEX_DIRECTORY_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "connex/base/clock.h"
#include "connex/base/lid.h"
#include "connex/directory/protocol.h"

namespace connex::directory {

struct RegistryOptions {
  int64_t lease_ttl_ms = 3000;
  // First epoch handed out. The server seeds it from the wall clock so that epochs keep growing
  // across a restart of an in-memory directory.
  uint64_t first_epoch = 1;
  // How many ended (lid, epoch) pairs are remembered to explain a refused heartbeat.
  size_t max_tombstones = 65536;
};

class Registry {
 public:
  Registry(Clock* clock, RegistryOptions options);

  struct JoinResult {
    uint64_t epoch = 0;
    bool changed = false;  // false: an idempotent retry of the holder's own JOIN
  };
  // Registers `lid` for holder `instance` (a random id per client process). The holder re-joining
  // with new addresses is a migration; another instance supersedes the holder, unless
  // `exclusive` (a rejoin after eviction), which fails with FailedPrecondition instead.
  absl::StatusOr<JoinResult> Join(const Lid& lid, const std::vector<std::string>& addresses,
                                  const std::map<std::string, std::string>& metadata,
                                  uint64_t instance, bool exclusive = false);

  // Renews the lease of (lid, epoch). FailedPrecondition: another epoch holds the LID, or this
  // one was superseded or left (stop claiming the LID). NotFound: the epoch was evicted or is
  // unknown, and nobody holds the LID (join again).
  // Returns the epoch the instance holds: `epoch`, or a later one when a JOIN of this instance
  // was applied but its reply never reached it (the client adopts it).
  absl::StatusOr<uint64_t> Heartbeat(const Lid& lid, uint64_t epoch, uint64_t instance);

  // Graceful leave. `epoch` 0 means whatever epoch holds the LID (an operator's drain).
  absl::Status Leave(const Lid& lid, uint64_t epoch);

  // Evicts (lid, epoch) for everyone; `epoch` 0 means the current one. Returns false when that
  // epoch no longer holds the LID (nothing to do). NotFound for a LID that is not registered.
  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch, std::string_view reporter);

  // Evicts every record whose lease ran out (FAILED, reason lease-expired).
  void ExpireLeases();

  // Milliseconds until the next lease runs out (nullopt when there are no records).
  std::optional<int64_t> MsUntilNextExpiry() const;

  // Records, optionally only those of `model` (and `group`), sorted by LID.
  Snapshot Snap(uint64_t incarnation, std::optional<std::string> model = std::nullopt,
                std::optional<uint32_t> group = std::nullopt) const;

  // Events produced since the last call, in revision order.
  std::vector<Event> TakeEvents();

  uint64_t revision() const { return revision_; }
  size_t size() const { return records_.size(); }
  int64_t lease_ttl_ms() const { return options_.lease_ttl_ms; }

 private:
  struct Entry {
    Record record;
    uint64_t instance = 0;
    int64_t deadline_ms = 0;
  };
  enum class Ended { kLeft, kFailed, kSuperseded };

  void Emit(EventKind kind, const Record& record, uint64_t previous_epoch, std::string reason);
  void Tombstone(const Lid& lid, uint64_t epoch, Ended how);
  Record WithLease(const Entry& entry) const;

  Clock* clock_;
  RegistryOptions options_;
  uint64_t next_epoch_;
  uint64_t revision_ = 0;
  std::map<Lid, Entry> records_;
  std::map<std::pair<Lid, uint64_t>, Ended> tombstones_;
  std::deque<std::pair<Lid, uint64_t>> tombstone_order_;
  std::vector<Event> pending_;
};

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_REGISTRY_H_
