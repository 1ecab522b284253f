// EtcdStore: the directory's table kept in etcd (docs/design/etcd.md) — JOIN, migration, forced
// takeover, LEAVE, REPORT_FAILED and snapshots as etcd transactions on per-LID keys bound to
// the holder's lease, with the epoch of an incarnation = etcd's revision of the JOIN that made it
// (unique and monotonic across the cluster and every restart: a fencing token that never
// repeats). EventDeriver turns a model's etcd watch into the directory's events (JOINED, LEFT,
// FAILED with its reason, MIGRATED), so that watchers see what they see on the embedded directory.
//
// The membership rules are the embedded directory's (connex/directory/registry.h, the same
// JoinAuth and Caller): a live holder is never displaced without a forced JOIN; only the holder
// of an incarnation (its credential) may migrate or leave it; REPORT_FAILED comes from a live
// member of the model or the operator. Here each rule is a comparison inside the transaction that
// acts, so two processes racing through different etcd members cannot both win. What etcd
// cannot check — the operator's admin token — is checked by this class before the transaction:
// with etcd, whoever may write the keys is decided by etcd's own auth (users, roles per prefix).
//
// Thread-safe: every method may be called from any thread. An EventDeriver is thread-compatible.
#ifndef CONNEX_DIRECTORY_ETCD_ETCD_STORE_H_
#define CONNEX_DIRECTORY_ETCD_ETCD_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/base/mutex.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/protocol.h"
#include "connex/directory/registry.h"

namespace connex::directory::etcd {

// ---- keys (docs/design/etcd.md, "Keys") ----
// Every key lives under kRoot; a model's under ModelPrefix(model).
inline constexpr std::string_view kRoot = "/connex/v1/m/";
std::string ModelPrefix(std::string_view model);  // /connex/v1/m/<model>/
std::string RecordKey(const Lid& lid);            // .../<model>/lid/g<G>/s<S>/r<R>
std::string CredentialKey(const Lid& lid);        // .../<model>/cred/g<G>/s<S>/r<R>
std::string EndKey(const Lid& lid);               // .../<model>/end/g<G>/s<S>/r<R>

// What a key under kRoot is: the LID it belongs to and which of the three keys it is.
struct ParsedKey {
  enum class Kind { kRecord, kCredential, kEnd };
  Kind kind = Kind::kRecord;
  Lid lid;
};
// InvalidArgument naming the key when it is not one of ours.
absl::StatusOr<ParsedKey> ParseKey(std::string_view key);

// The value of a record key (addresses and metadata; the epoch is the key's mod_revision) and of
// a credential key (the SHA-256 of the credential, in hex: etcd never stores the secret itself).
std::string EncodeRecordValue(const Record& record);
absl::StatusOr<Record> DecodeRecordValue(const Lid& lid, std::string_view value);
std::string CredentialDigest(std::string_view credential);

// The value of an end marker: how an incarnation ended (read back by EventDeriver).
inline constexpr std::string_view kEndLeft = "left";
inline constexpr std::string_view kEndSupersededPrefix = "superseded";
inline constexpr std::string_view kEndReportedPrefix = "reported";

// The records of `model` (every model when nullopt; and of `group` if given), sorted by LID,
// read linearizably at one revision (Snapshot::revision, also its model_revision); epochs are the
// records' mod_revisions, lease_left_ms is not filled (0). Keys that are not ours are skipped.
absl::StatusOr<Snapshot> ReadSnapshot(EtcdClient& client,
                                      std::optional<std::string> model = std::nullopt,
                                      std::optional<uint32_t> group = std::nullopt);

struct EtcdStoreOptions {
  // The lease of this store's holders; etcd counts in whole seconds (rounded up, at least 1) and
  // may raise a TTL under its minimum: lease_ttl_ms() is what etcd granted.
  int64_t lease_ttl_ms = 3000;
  // End markers live this long, so that a watcher resuming after a short outage still tells LEFT
  // from FAILED.
  int64_t end_marker_ttl_ms = 60000;
  // Limits, as the embedded directory's (RegistryOptions). The counts are read before the
  // JOIN's transaction: concurrent JOINs of new LIDs may pass a limit by their number.
  size_t max_records = kDefaultMaxRecords;
  size_t max_records_per_model = kDefaultMaxRecordsPerModel;
  size_t max_record_bytes = kDefaultMaxRecordBytes;
  // The operator's secret (CONNEX_DIRECTORY_ADMIN_TOKEN): forced JOINs and drains need it here.
  std::string admin_token;
  // Makes a per-incarnation credential; default NewCredential. Tests inject their own.
  std::function<std::string()> new_credential;
};

// One store per holder process: it owns the etcd lease that every LID it registers is bound to,
// kept alive every TTL / 3 across members. When etcd says the lease is gone (an outage longer
// than the TTL), lease_status() turns NotFound, every LID of the store has gone with a FAILED;
// RenewLease() grants a new one and the holder joins again (new epochs).
class EtcdStore {
 public:
  // Grants the lease and starts its keepalive. `client` must outlive the store.
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Open(EtcdClient* client,
                                                         EtcdStoreOptions options);
  ~EtcdStore();  // stops the keepalive and revokes the lease: this store's LIDs go (FAILED)

  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  // Registry::Join's contract on etcd. A JOIN of a free LID creates it (JOINED); the holder's
  // credential with other addresses migrates it (MIGRATED, a new epoch and credential), with the
  // same ones it is an idempotent retry. Without it: AlreadyExists naming the holder's epoch and
  // its lease's remaining TTL (FailedPrecondition when `exclusive`), unless `force` with the
  // admin token (PermissionDenied with a wrong one): then the old holder is fenced (FAILED
  // superseded) and the LID is ours. ResourceExhausted / InvalidArgument over the limits.
  absl::StatusOr<Registry::JoinResult> Join(const Lid& lid,
                                            const std::vector<std::string>& addresses,
                                            const std::map<std::string, std::string>& metadata,
                                            const JoinAuth& auth = {});

  // Whether (lid, epoch) still holds the LID with this store's lease (a linearizable read): the
  // holder's check of its own incarnation, with the embedded directory's heartbeat answers
  // (Registry::Heartbeat): FailedPrecondition when another epoch holds the LID or this one left
  // (drained or its own LEAVE) — stop claiming the LID; NotFound when it was evicted (reported,
  // or its lease ran out) and nobody holds it, or it is still bound to a lease this store held
  // before an outage made it grant a new one — join again. The message names what happened.
  absl::Status Confirm(const Lid& lid, uint64_t epoch);

  // Graceful LEAVE by the holder (`caller.credential`) or an operator's drain
  // (`caller.admin_token`); `epoch` 0 = whatever epoch holds the LID. NotFound when no epoch (or
  // not that one) holds it; PermissionDenied for a wrong credential.
  absl::Status Leave(const Lid& lid, uint64_t epoch, const Caller& caller);

  // Evicts (lid, epoch) for everyone (FAILED reported), epoch 0 = the current one. Accepted from
  // a live member of the model (`caller.member` with its credential) or with the admin token,
  // else PermissionDenied. False when that epoch no longer holds the LID; NotFound for a LID
  // that is not registered.
  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch, const Caller& caller);

  // ReadSnapshot through this store's client.
  absl::StatusOr<Snapshot> Snap(std::optional<std::string> model = std::nullopt,
                                std::optional<uint32_t> group = std::nullopt);

  // OK while the lease is kept alive; NotFound once etcd says it expired or was revoked.
  absl::Status lease_status() const;
  // When (steady_clock, ms) the lease's last acknowledged renewal was sent (or it was granted);
  // nullopt when the store holds no lease.
  std::optional<int64_t> lease_renewed_steady_ms() const;
  // Grants a new lease after the old one was lost (the holder then joins its LIDs again).
  absl::Status RenewLease();
  int64_t lease_id() const;
  int64_t lease_ttl_ms() const;
  // Stops renewing the lease without revoking it: what etcd sees of a process that was killed.
  void StopRenewingForTest();

 private:
  EtcdStore(EtcdClient* client, EtcdStoreOptions options);
  absl::Status GrantLease();
  // The end marker's lease (a fresh one per marker: ends are rare).
  absl::StatusOr<int64_t> MarkerLease();
  absl::Status CheckAdmin(std::string_view token, std::string_view what) const;
  bool WasOurLease(int64_t lease) const;
  // The remaining TTL of `lease` for messages ("" when unknown).
  std::string LeaseLeft(int64_t lease);

  EtcdClient* client_;
  EtcdStoreOptions options_;
  mutable Mutex mu_;
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  // The leases this store held before lease_id_ (lost in outages): a record still bound to one
  // is this process's own, to join again, not another process's.
  std::set<int64_t> previous_leases_ ABSL_GUARDED_BY(mu_);
  Mutex renew_mu_;  // RenewLease: one grant at a time
  int64_t lease_ttl_ms_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<EtcdKeepAlive> keepalive_ ABSL_GUARDED_BY(mu_);
};

// Turns one model's watch (WatchOptions with prev_kv) into directory events. Feed it every
// WatchResponse in order; the events of one revision (one transaction) are classified together:
//   PUT lid (version 1)                   JOINED, epoch = the revision
//   PUT lid (version > 1)                 MIGRATED, previous_epoch = the previous mod_revision
//   PUT lid + PUT end "superseded ..."    FAILED superseded (the old record), then JOINED
//   DELETE lid + PUT end "left"           LEFT
//   DELETE lid + PUT end "reported ..."   FAILED with that reason
//   DELETE lid alone                      FAILED lease-expired
// Each event's model_previous is the revision of the event before it (the snapshot's revision
// for the first), since an etcd watch misses nothing it does not report as compacted.
class EventDeriver {
 public:
  // `after`: the revision of the snapshot the watch starts after.
  explicit EventDeriver(uint64_t after) : last_revision_(after) {}
  // The events of `response`, in revision order. Keys that are not ours are skipped and
  // counted (skipped()).
  std::vector<Event> Apply(const WatchResponse& response);
  uint64_t last_revision() const { return last_revision_; }
  uint64_t skipped() const { return skipped_; }

 private:
  void ApplyRevision(const std::vector<const WatchEvent*>& events, std::vector<Event>* out);
  uint64_t last_revision_;
  uint64_t skipped_ = 0;
};

}  // namespace connex::directory::etcd

#endif  // CONNEX_DIRECTORY_ETCD_ETCD_STORE_H_
