// What differs between the directory's backends, and nothing else: the membership
// transactions, the renewal of a LID's lease, snapshots, and the watch that feeds a WatchSink.
// `tcp://HOST:PORT` is the embedded connex-directory (zmq_store.cc), `etcd://H1:P1,...` an etcd
// cluster (etcd/etcd_directory_store.cc). Everything above it — the lease keeper, rejoin, the
// watched view, subscriber delivery, vouching for reports — is written once (lease_keeper.h,
// watched_view.h, client.cc) and holds for both; client_conformance_test.cc runs its rules on
// each backend.
#ifndef CONNEX_DIRECTORY_INTERNAL_STORE_H_
#define CONNEX_DIRECTORY_INTERNAL_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/directory/protocol.h"
#include "connex/directory/registry.h"

namespace connex::directory {

struct DirectoryClientOptions;

namespace internal {

// Where a store delivers what it watches. A store calls it in order: for each scope, its first
// snapshot before any of its events, and events in revision order with no gap (a store that
// finds a gap takes a fresh snapshot of the scope and reports that instead). Calls may come
// from the store's threads; they must not block for long.
class WatchSink {
 public:
  virtual ~WatchSink() = default;
  // `scope`'s records ("" every model) as of a snapshot: they replace the view's.
  virtual void OnSnapshot(const std::string& scope, Snapshot snapshot) = 0;
  // The next event of a watched scope.
  virtual void OnEvent(const Event& event) = 0;
};

// What a renewal of (lid, epoch) found: the epoch the directory holds for this client, and the
// credential of it when the directory says it is not the renewed one (a JOIN of ours was applied
// but its reply was lost: the directory knows better).
struct Renewal {
  uint64_t epoch = 0;
  std::string credential;
};

// One held epoch to renew.
struct Held {
  Lid lid;
  uint64_t epoch = 0;
  std::string credential;
};

// Thread-safe. Blocking calls; none may be made from the store's own threads (a sink callback).
class DirectoryStore {
 public:
  virtual ~DirectoryStore() = default;

  // The lease TTL the directory keeps a LID for after its last renewal, and the interval it
  // advises holders to renew at.
  virtual int64_t lease_ttl_ms() const = 0;
  virtual int64_t advised_heartbeat_ms() const = 0;

  // ---- transactions (Registry's contract: registry.h) ----
  virtual absl::StatusOr<Registry::JoinResult> Join(
      const Lid& lid, const std::vector<std::string>& addresses,
      const std::map<std::string, std::string>& metadata, const JoinAuth& auth) = 0;
  // `epoch` 0: whichever epoch holds the LID (an operator's drain, with `caller.admin_token`).
  virtual absl::Status Leave(const Lid& lid, uint64_t epoch, const Caller& caller) = 0;
  virtual absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch,
                                            const Caller& caller) = 0;
  virtual absl::StatusOr<Snapshot> GetSnapshot(std::optional<std::string> model,
                                               std::optional<uint32_t> group) = 0;

  // ---- the lease ----
  // Renews each held epoch's lease (a HEARTBEAT on the embedded directory; on etcd, whose lease
  // is the process's and kept alive by etcd's keepalive, a check that the record is still this
  // epoch's), all within `timeout_ms`, and returns one result per entry: the Renewal, or
  // NotFound (evicted and free: join again), FailedPrecondition (another epoch holds it, or it
  // left: give it up; EndedByLeave tells a LEAVE), Unavailable / DeadlineExceeded (unreachable).
  virtual std::vector<absl::StatusOr<Renewal>> Renew(const std::vector<Held>& held,
                                                     int64_t timeout_ms) = 0;
  // At least how long the directory keeps a LID by itself from now, given that its last
  // renewal acknowledged by Renew (or its JOIN) was `renewal_age_ms` ago. nullopt when unknown.
  virtual std::optional<int64_t> LeaseLeftMs(int64_t renewal_age_ms) const = 0;

  // ---- the watch ----
  // Starts watching `model` ("" every model) into the sink; returns once its first snapshot was
  // delivered and its events flow. A watch of every model replaces the per-model ones.
  virtual absl::Status Watch(const std::string& model) = 0;
  virtual uint64_t view_revision() const = 0;
  // Event messages received (a watcher of one model receives only that model's).
  virtual uint64_t events_received() const = 0;
  // Drops the next `n` events received, before the store's gap detection sees them.
  virtual void DropEventsForTest(int n) = 0;
  // Where the embedded directory publishes events ("" on etcd).
  virtual const std::string& pub_address() const = 0;
};

// Opens the store of `options.directory`'s backend, delivering watches into `sink` (which must
// outlive the store).
using StoreFactory = std::function<absl::StatusOr<std::unique_ptr<DirectoryStore>>(
    const DirectoryClientOptions& options, WatchSink* sink)>;

absl::StatusOr<std::unique_ptr<DirectoryStore>> OpenZmqStore(const DirectoryClientOptions& options,
                                                             WatchSink* sink);

// The backend of a scheme other than tcp:// ("etcd"), registered by the library that implements
// it (etcd/etcd_backend.h: RegisterEtcdBackend), so that only binaries that link it pay for it.
void RegisterStore(const std::string& scheme, StoreFactory factory);

// Loads the backend of `scheme` built as a plugin, libconnex-SCHEME.so, which registers itself:
// from CONNEX_PLUGIN_DIR, else the running program's folder, else its ../lib/connex. NotFound
// names every path tried; FailedPrecondition says why a plugin found did not load. Only a program
// linked with ENABLE_EXPORTS can load one (store_plugin.cc). Thread-safe.
absl::Status LoadStorePlugin(const std::string& scheme);

}  // namespace internal
}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_INTERNAL_STORE_H_
