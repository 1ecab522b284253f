// EtcdClient: an etcd v3 client over gRPC (KV, Lease, Watch, Maintenance status, Auth), for the
// directory's etcd backend. It talks to every member listed in `etcd://H1:P1,H2:P2,...`: a call
// goes to the member that last answered and moves on to the next one when that member is
// unreachable (Unavailable, or no answer within the attempt timeout), with backoff after each
// round of the whole list, until the call's deadline. Watches and keepalives are streams that
// resume on another member the same way.
//
// Thread-safe: every method of EtcdClient may be called from any thread at once. An EtcdWatch
// or an EtcdKeepAlive is thread-safe too; each owns one background thread that reads its stream.
// Both must be destroyed before the client that made them.
#ifndef CONNEX_DIRECTORY_ETCD_ETCD_CLIENT_H_
#define CONNEX_DIRECTORY_ETCD_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "connex/directory/etcd/endpoints.h"

namespace connex::directory::etcd {

struct EtcdTlsOptions {
  // PEM files. With `ca_file` set the client speaks TLS to every member and verifies each
  // against this CA; `cert_file` and `key_file` (both or neither) add a client certificate for
  // etcd's --client-cert-auth.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  bool enabled() const { return !ca_file.empty(); }
};

struct EtcdClientOptions {
  // etcd://H1:P1,H2:P2,... (endpoints.h).
  std::string address;
  // etcd user/password auth (etcd's `auth enable`): with a user, the client gets a token from
  // Authenticate and sends it with every call, fetching a new one when a member refuses it.
  // Empty: no auth.
  std::string user;
  std::string password;
  EtcdTlsOptions tls;
  // Deadline of one call (Range, Put, Txn, ...), across every member and retry.
  absl::Duration call_timeout = absl::Seconds(5);
  // Deadline of one attempt on one member; then the call moves on to the next member. Keep it
  // under call_timeout so that a stopped (not dead) member is skipped in time.
  absl::Duration attempt_timeout = absl::Seconds(1);
  // Pause after every member of the list failed once, doubling up to max_backoff.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
  // gRPC keepalive pings while a call or stream is open, so that a stream to a stopped or
  // cut-off member fails (after keepalive_time + keepalive_timeout of silence) and the watch
  // moves on. etcd's --grpc-keepalive-min-time (default 5 s) answers pings more often than that
  // with GOAWAY "too_many_pings" — seen at 5 s exactly after half a minute of a quiet watch — so
  // keep keepalive_time well above the cluster's minimum.
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(2);
  // A watch that has heard nothing from its member for this long asks it for progress, and
  // moves to another member when no answer comes within attempt_timeout: a stopped member is
  // left in about probe interval + attempt timeout, however quiet the watch.
  absl::Duration watch_probe_interval = absl::Seconds(2);
};

// etcd's mvccpb.KeyValue.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;  // 1 for a new key, +1 per put; a deleted key has none
  int64_t lease = 0;    // 0: not bound to a lease
};

// The end of the range of every key that starts with `prefix` (etcd's "prefix end").
std::string PrefixEnd(std::string_view prefix);

struct RangeOptions {
  std::string range_end;  // empty: `key` alone; PrefixEnd(key): every key under it
  int64_t limit = 0;      // 0: no limit
  int64_t revision = 0;   // 0: the latest; else the view at that revision (OutOfRange: compacted)
  // Serializable reads are answered by the member alone (possibly stale); the default is
  // linearizable (through the leader).
  bool serializable = false;
  bool keys_only = false;
  bool count_only = false;
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision the read saw
  std::vector<KeyValue> kvs;
  bool more = false;  // `limit` cut the list short
  int64_t count = 0;  // keys in the range
};

struct PutResult {
  int64_t revision = 0;             // the revision of this put
  std::optional<KeyValue> prev_kv;  // with `prev_kv`, the key's previous value if it had one
};

struct DeleteResult {
  int64_t revision = 0;
  int64_t deleted = 0;
  std::vector<KeyValue> prev_kvs;  // with `prev_kv`
};

// One comparison of a transaction, on one key's create_revision, mod_revision, version, value or
// lease. A key that does not exist has create_revision = mod_revision = version = 0.
struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  int64_t number = 0;  // version, a revision or a lease id
  std::string value;   // for kValue

  static Compare Version(std::string key, Result result, int64_t version);
  static Compare CreateRevision(std::string key, Result result, int64_t revision);
  static Compare ModRevision(std::string key, Result result, int64_t revision);
  static Compare Value(std::string key, Result result, std::string value);
  static Compare Lease(std::string key, Result result, int64_t lease);
  // The key does not exist (its create_revision is 0).
  static Compare Absent(std::string key) {
    return CreateRevision(std::move(key), Result::kEqual, 0);
  }
};

// One operation of a transaction.
struct TxnOp {
  enum class Kind { kRange, kPut, kDelete };
  Kind kind = Kind::kRange;
  std::string key;
  std::string value;      // kPut
  int64_t lease = 0;      // kPut
  std::string range_end;  // kRange, kDelete
  bool prev_kv = false;   // kPut, kDelete

  static TxnOp Get(std::string key, std::string range_end = "");
  static TxnOp Put(std::string key, std::string value, int64_t lease = 0);
  static TxnOp Delete(std::string key, std::string range_end = "");
};

// What one TxnOp returned: the field of its kind is filled.
struct TxnOpResult {
  TxnOp::Kind kind = TxnOp::Kind::kRange;
  RangeResult range;
  PutResult put;
  DeleteResult del;
};

struct Txn {
  std::vector<Compare> compare;  // all must hold for `success` to run, else `failure` runs
  std::vector<TxnOp> success;
  std::vector<TxnOp> failure;
};

struct TxnResult {
  bool succeeded = false;  // the comparisons held
  int64_t revision = 0;    // the store's revision after the transaction
  std::vector<TxnOpResult> results;
};

struct LeaseGrantResult {
  int64_t id = 0;
  int64_t ttl_seconds = 0;  // as granted (etcd may raise a TTL under its minimum)
};

struct LeaseTimeToLiveResult {
  int64_t id = 0;
  int64_t ttl_seconds = -1;  // remaining; -1 once the lease has expired or was revoked
  int64_t granted_ttl_seconds = 0;
  std::vector<std::string> keys;  // with `keys`, the keys bound to it
};

struct MemberStatus {
  std::string endpoint;  // the member asked, host:port
  uint64_t member_id = 0;
  uint64_t leader_id = 0;  // 0: the member knows no leader
  uint64_t raft_term = 0;
  int64_t revision = 0;
  std::string version;  // etcd's version, e.g. 3.4.23
};

struct WatchOptions {
  std::string range_end;       // as RangeOptions::range_end
  int64_t start_revision = 0;  // 0: from now on; else every event at and after it
  bool prev_kv = false;        // events carry the key's previous value
  // The member sends empty responses (progress notifications) while nothing happens, so that
  // the watcher learns how far it is up to date.
  bool progress_notify = false;
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: the key and the delete's mod_revision
  std::optional<KeyValue> prev_kv;
};

struct WatchResponse {
  int64_t revision = 0;            // the store's revision when the member sent this
  std::vector<WatchEvent> events;  // in revision order
  bool progress_notify = false;    // no events: the watcher is up to date as of `revision`
};

// The revision that `status` (from EtcdWatch::Next or a Range at a revision) says was compacted,
// if it is etcd's "required revision has been compacted" (OutOfRange).
std::optional<int64_t> CompactRevisionOf(const absl::Status& status);

class EtcdClient;

// A watch of one key or range, from EtcdClient::Watch. It delivers every event at and after its
// start revision exactly once and in order: when its member fails, it resumes on another from
// the revision after the last one it delivered (or reported as progress). Thread-safe.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  // The next response. DeadlineExceeded: none within `timeout`. OutOfRange: the revision the
  // watch needs next was compacted — CompactRevisionOf names the compaction's revision, and the
  // watch is over (take a snapshot and watch again from its revision + 1). Cancelled: Cancel()
  // was called. FailedPrecondition / PermissionDenied: etcd cancelled the watch for that reason
  // (over too). A member failing is no error: the watch moves on.
  virtual absl::StatusOr<WatchResponse> Next(absl::Duration timeout) = 0;
  // Stops the watch; Next returns what was already received, then Cancelled.
  virtual void Cancel() = 0;
  // The member the watch streams from now (host:port), or empty between members.
  virtual std::string member() const = 0;
  // The revision the watch would resume from on another member.
  virtual int64_t next_revision() const = 0;
};

// Keeps one lease alive over a KeepAlive stream, from EtcdClient::KeepAlive: a renewal every
// `interval` (well inside the TTL), moving to another member when one fails. Thread-safe.
class EtcdKeepAlive {
 public:
  virtual ~EtcdKeepAlive() = default;
  // OK while etcd renews the lease (or it is trying to reach a member and the lease may still be
  // alive); NotFound once etcd said the lease has expired or was revoked (then the keepalive
  // stops: grant a new lease).
  virtual absl::Status status() const = 0;
  // The TTL etcd reported at the last renewal, and how many renewals it acknowledged.
  virtual int64_t last_ttl_seconds() const = 0;
  virtual int64_t renewals() const = 0;
  // When (steady_clock, ms) the renewal etcd last acknowledged was sent, or the keepalive started
  // (the lease was granted just before): etcd cannot expire the lease sooner than a TTL after.
  virtual int64_t renewed_steady_ms() const = 0;
  // Stops renewing (the lease then runs out unless revoked). Returns at once; the destructor
  // waits for a renewal in flight, at most the client's call_timeout.
  virtual void Stop() = 0;
};

class EtcdClient {
 public:
  // Parses the address (InvalidArgument), reads the TLS files (InvalidArgument naming a file
  // that cannot be read) and, with a user, authenticates (Unavailable when no member answers,
  // InvalidArgument for a wrong user or password, naming the member). Dialing itself
  // is lazy: a member that is down now is tried again on later calls.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const EtcdClientOptions& options);
  virtual ~EtcdClient() = default;

  // Every call below fails with a Status whose message names the RPC and the member(s):
  // Unavailable when no member answered within call_timeout (each member's last error is
  // listed); the member's own code otherwise (e.g. OutOfRange for a compacted revision,
  // InvalidArgument for a lease that etcd does not know). A mutation that fails with
  // Unavailable or DeadlineExceeded may still have been applied: retries on another member
  // happen inside the call, so write transactions whose retry is harmless (compare on the
  // caller's own value).

  virtual absl::StatusOr<RangeResult> Range(std::string_view key,
                                            const RangeOptions& options = {}) = 0;
  // `lease` 0: the key is bound to no lease.
  virtual absl::StatusOr<PutResult> Put(std::string_view key, std::string_view value,
                                        int64_t lease = 0, bool prev_kv = false) = 0;
  virtual absl::StatusOr<DeleteResult> DeleteRange(std::string_view key,
                                                   std::string_view range_end = "",
                                                   bool prev_kv = false) = 0;
  virtual absl::StatusOr<TxnResult> Transact(const Txn& txn) = 0;
  // Compacts the history up to `revision` (watches from below it then get OutOfRange).
  virtual absl::Status Compact(int64_t revision) = 0;

  virtual absl::StatusOr<LeaseGrantResult> LeaseGrant(int64_t ttl_seconds) = 0;
  // Deletes every key bound to the lease. NotFound: etcd does not know the lease.
  virtual absl::Status LeaseRevoke(int64_t lease) = 0;
  virtual absl::StatusOr<LeaseTimeToLiveResult> LeaseTimeToLive(int64_t lease,
                                                                bool keys = false) = 0;
  // Starts renewing `lease` every `interval` on a KeepAlive stream.
  virtual std::unique_ptr<EtcdKeepAlive> KeepAlive(int64_t lease, absl::Duration interval) = 0;

  // Starts a watch of `key` (and `options.range_end`). With start_revision 0 it starts at the
  // revision the member is at when it creates the watch: pass a snapshot's revision + 1 to
  // miss nothing.
  virtual std::unique_ptr<EtcdWatch> Watch(std::string_view key,
                                           const WatchOptions& options = {}) = 0;

  // The status of member `index` of the address's list (one attempt, no moving on).
  virtual absl::StatusOr<MemberStatus> Status(size_t index) = 0;

  // The members, in the address's order.
  virtual const std::vector<EtcdEndpoint>& members() const = 0;
  // The member that calls go to first now (host:port).
  virtual std::string current_member() const = 0;
};

}  // namespace connex::directory::etcd

#endif  // CONNEX_DIRECTORY_ETCD_ETCD_CLIENT_H_
