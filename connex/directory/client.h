// DirectoryClient: talks to the directory at `options.directory` — a DirectoryServer
// (`tcp://HOST:PORT`, the embedded connex-directory) or an etcd cluster (`etcd://H1:P1,...`,
// docs/design/etcd.md; in binaries that link the etcd backend: etcd/etcd_backend.h). As a holder
// it registers LIDs and keeps their leases alive (renewals on its own thread, rejoining under a
// new epoch after a wrongful eviction, and giving a LID up when another process supersedes it).
// As a watcher it keeps a live view of the records of the models it watches: a snapshot at
// revision R plus the events after R, with a fresh snapshot whenever a gap shows (missed event,
// directory restart). Both backends share every rule above (internal/store.h: only the
// transactions, the renewal and the watch differ).
//
// Thread-safe: every method may be called from any thread. Callbacks run on the client's own
// threads; they must not block nor call the blocking methods (Join, Leave, GetSnapshot, ...).
#ifndef CONNEX_DIRECTORY_CLIENT_H_
#define CONNEX_DIRECTORY_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/clock.h"
#include "connex/base/curve.h"
#include "connex/base/lid.h"
#include "connex/directory/held_lease.h"
#include "connex/directory/protocol.h"

namespace connex::directory {

struct DirectoryClientOptions {
  std::string directory = "tcp://127.0.0.1:7000";  // CONNEX_DIRECTORY
  std::string token;  // CONNEX_DIRECTORY_TOKEN, or the first line of CONNEX_DIRECTORY_TOKEN_FILE
  // The operator's secret, for ForceJoin, Evict and reports from outside a model.
  // CONNEX_DIRECTORY_ADMIN_TOKEN, or the first line of CONNEX_DIRECTORY_ADMIN_TOKEN_FILE.
  std::string admin_token;
  int64_t heartbeat_ms = 0;           // CONNEX_HEARTBEAT_MS; 0 = what the directory advises
  int64_t request_timeout_ms = 3000;  // CONNEX_DIRECTORY_TIMEOUT_MS
  bool rejoin_after_eviction = true;  // join again (new epoch) when a heartbeat finds us evicted
  // Join of a LID held by a live lease waits up to one lease TTL (plus a heartbeat) for it to
  // run out — a restarted process whose previous incarnation died — before AlreadyExists.
  bool join_waits_for_lease = true;
  // CURVE (connex/base/curve.h): with a key pair, the client reaches the directory as a CURVE
  // client of `curve.directory_key`. CONNEX_CURVE_KEY_FILE, CONNEX_DIRECTORY_SERVER_KEY.
  CurveSettings curve;
  // Time for request deadlines, heartbeats and the lease wait of Join (not owned; must outlive
  // the client). nullptr: the real monotonic clock. Tests pass a FakeClock.
  Clock* clock = nullptr;
  // The etcd backend's settings (`etcd://` addresses only; docs/design/etcd.md).
  struct Etcd {
    std::string user;       // CONNEX_ETCD_USER
    std::string password;   // the first line of CONNEX_ETCD_PASSWORD_FILE
    std::string ca_file;    // CONNEX_ETCD_CA_FILE: TLS to the members
    std::string cert_file;  // CONNEX_ETCD_CERT_FILE: the client certificate (client auth)
    std::string key_file;   // CONNEX_ETCD_KEY_FILE
    // The TTL of the process's etcd lease, which every LID it holds is bound to
    // (CONNEX_LEASE_TTL_MS; the embedded directory sets its own).
    int64_t lease_ttl_ms = 3000;
    // How long one call may wait on one member before it moves to the next
    // (CONNEX_ETCD_ATTEMPT_TIMEOUT_MS), and how long a quiet watch waits before it asks its member
    // for progress (CONNEX_ETCD_WATCH_PROBE_MS): a lost member is left after about the first
    // for a call, the sum of both for a watch.
    int64_t attempt_timeout_ms = 1000;
    int64_t watch_probe_ms = 2000;
    // The defaults overridden by the variables above.
    static absl::StatusOr<Etcd> FromEnv();
  } etcd;

  // Defaults overridden by CONNEX_DIRECTORY, CONNEX_DIRECTORY_TOKEN, CONNEX_HEARTBEAT_MS,
  // CONNEX_DIRECTORY_TIMEOUT_MS, CONNEX_DIRECTORY_ADMIN_TOKEN(_FILE), the CURVE settings and the
  // etcd settings above.
  static absl::StatusOr<DirectoryClientOptions> FromEnv();
};

// What happened to one of this client's registrations, reported asynchronously.
struct RegistrationChange {
  Lid lid;
  uint64_t old_epoch = 0;
  uint64_t new_epoch = 0;  // 0 when the registration is gone
  absl::Status status;     // OK: rejoined under new_epoch; FailedPrecondition: superseded/left
  // The epoch ended by a LEAVE (its holder's own, or an operator's drain: `connexctl drain`),
  // not by an eviction or a supersession (EndedByLeave of the directory's refusal).
  bool left = false;
};

class DirectoryClient {
 public:
  // Connects and says HELLO. Unavailable/DeadlineExceeded when no directory answers;
  // PermissionDenied when the directory refuses this client's CURVE key or settings.
  static absl::StatusOr<std::unique_ptr<DirectoryClient>> Connect(DirectoryClientOptions options);
  // Stops heartbeating without leaving: the directory sees the leases run out, as after a crash.
  // Call Leave (or LeaveAll) first for a graceful exit.
  ~DirectoryClient();

  DirectoryClient(const DirectoryClient&) = delete;
  DirectoryClient& operator=(const DirectoryClient&) = delete;

  // ---- holder side ----
  // Registers `lid` at `addresses` and keeps its lease alive. Joining a LID this client already
  // holds with other addresses is a migration (new epoch). Returns the epoch; the incarnation's
  // credential stays inside this client, which presents it with heartbeats, Leave and
  // migrations. AlreadyExists (naming the holder's epoch) when another process holds `lid` and
  // its lease stays live for a whole lease TTL (see `join_waits_for_lease`).
  absl::StatusOr<uint64_t> Join(const Lid& lid, std::vector<std::string> addresses,
                                std::map<std::string, std::string> metadata = {});
  // An operator's takeover: Join that displaces a live holder (FAILED superseded; its next
  // heartbeat is refused). PermissionDenied without the right `admin_token`.
  absl::StatusOr<uint64_t> ForceJoin(const Lid& lid, std::vector<std::string> addresses,
                                     std::map<std::string, std::string> metadata = {});
  // Leaves gracefully (LEFT). NotFound if this client does not hold `lid`; OK when the directory
  // no longer held it either (evicted, expired or superseded meanwhile).
  absl::Status Leave(const Lid& lid);
  absl::Status LeaveAll();
  // Renews `lid`'s lease now, outside the heartbeat schedule (a holder that was frozen or starved
  // asks whether its epoch is still current), and returns the epoch the directory holds for this
  // client. FailedPrecondition when the directory no longer holds it (evicted or superseded: the
  // client then joins again, or gives the LID up, as after a refused heartbeat, and says so
  // through OnRegistrationChange); NotFound when this client does not hold `lid`; Unavailable or
  // DeadlineExceeded when the directory does not answer within a heartbeat interval.
  absl::StatusOr<uint64_t> Renew(const Lid& lid);
  // The epoch under which this client holds `lid`, if it does.
  std::optional<uint64_t> EpochOf(const Lid& lid) const;
  // What this client knows of its hold on `lid` (held_lease.h): the epoch, an eviction it is
  // rejoining from, a loss and why, an operator's drain — kept up to date by the client, read
  // from any thread, and valid after the client is gone. The same handle for every call and
  // every Join of `lid`; asking before the Join is fine (epoch 0, not held). FAILED and LEFT
  // events reach it only for the models this client watches; renewals find the rest.
  std::shared_ptr<const HeldLease> Lease(const Lid& lid);
  void OnRegistrationChange(std::function<void(const RegistrationChange&)> callback);

  // ---- requests ----
  absl::StatusOr<Snapshot> GetSnapshot(std::optional<std::string> model = std::nullopt,
                                       std::optional<uint32_t> group = std::nullopt);
  // Evicts (lid, epoch) for everyone (epoch 0: the current one). Returns whether it was evicted
  // (false: that epoch was already gone). `reporter` is recorded in the FAILED event.
  // Accepted from a member: this client must hold a live LID of `lid`'s model (its credential
  // vouches for the report), or have the admin token; PermissionDenied otherwise.
  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch, std::string_view reporter = "");
  // An operator's drain of a LID held by anyone (LEFT). Needs the admin token (PermissionDenied,
  // without asking the directory when this client has none).
  absl::Status Evict(const Lid& lid);

  // ---- watcher side ----
  // Watches `model` ("" = every model): subscribes to that model's events (its topic only: other
  // models' traffic never reaches this client) and takes its first snapshot before returning.
  // May be called for several models; DeadlineExceeded when no snapshot comes in time.
  absl::Status Watch(std::string model);
  // The watched records (of `model`, and of `group` if given), sorted by LID.
  std::vector<Record> View(std::string_view model,
                           std::optional<uint32_t> group = std::nullopt) const;
  // Calls `callback` for every event applied to the view, in revision order, including events
  // synthesized after a fresh snapshot (so a subscriber never misses a change). Returns an id.
  uint64_t Subscribe(std::function<void(const Event&)> callback);
  void Unsubscribe(uint64_t id);
  // Blocks until `predicate(view of model)` holds or `timeout_ms` passes; returns whether it held.
  bool AwaitView(std::string_view model,
                 const std::function<bool(const std::vector<Record>&)>& predicate,
                 int64_t timeout_ms) const;

  uint64_t view_revision() const;
  uint64_t resnapshots() const;
  // EVENT frames received from the directory: a watcher of one model receives only that model's.
  uint64_t events_received() const;
  const std::string& pub_address() const;
  const std::string& directory_address() const;
  int64_t lease_ttl_ms() const;
  int64_t heartbeat_ms() const;  // the interval this client heartbeats at
  // How long ago the directory last confirmed the epoch this client holds `lid` under (its JOIN
  // or a heartbeat's reply); nullopt when it does not hold `lid`. A holder cut off from the
  // directory sees this grow past the heartbeat interval.
  std::optional<int64_t> RenewalAgeMs(const Lid& lid) const;
  // At least how long the directory keeps `lid`'s lease by itself (no failure report, no new
  // JOIN) from now: the lease TTL less the time since the renewal it last acknowledged (the
  // holder process's etcd lease on etcd). Negative once it may have run out; nullopt when this
  // client does not hold `lid`.
  std::optional<int64_t> LeaseLeftMs(const Lid& lid) const;
  // Drops the next `n` events received, as a slow subscriber would. For gap-recovery tests.
  void DropEventsForTest(int n);
  // Holds every event `ms` milliseconds before subscribers see it (a slow directory), in order;
  // the view and the heartbeats are not delayed. For the step protocol's fault campaign.
  void DelayEventsForTest(int ms);

 private:
  class Impl;
  explicit DirectoryClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_CLIENT_H_
