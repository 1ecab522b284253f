// Registry: the directory's table of records, leases, epochs and events — the state machine
// behind DirectoryServer, with no I/O so that leases, epochs and supersession are tested with a
// fake clock. Thread-compatible: the server's loop thread owns it.
#ifndef CONNEX_DIRECTORY_REGISTRY_H_
#define CONNEX_DIRECTORY_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <functional>
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
  // Limits of the table (protocol.h explains the defaults): a JOIN over them is refused with
  // ResourceExhausted (records) or InvalidArgument (size), naming the limit.
  size_t max_records = kDefaultMaxRecords;
  size_t max_records_per_model = kDefaultMaxRecordsPerModel;
  size_t max_record_bytes = kDefaultMaxRecordBytes;
  // The operator's secret: forced JOINs, drains (LEAVE of another's LID), reports from outside
  // the model. Empty: no request is an operator's.
  std::string admin_token;
  // Makes a per-incarnation credential; default NewCredential (128 random bits). Tests inject a
  // deterministic one.
  std::function<std::string()> new_credential;
};

// What a registry keeps across a restart of its process (state_file.h stores it).
struct RegistryState {
  uint64_t next_epoch = 1;  // every epoch handed out so far is below it
  uint64_t revision = 0;
  struct Entry {
    Record record;  // lease_left_ms is not kept: a restored lease starts afresh
    std::string credential;
    uint64_t previous_epoch = 0;
    std::string previous_credential;
  };
  std::vector<Entry> entries;
};

// What a JOIN proves and asks for beyond the registration itself.
struct JoinAuth {
  std::string credential;   // the caller's credential of the LID: a migration or a retry
  bool exclusive = false;   // a rejoin after eviction: never displace anyone (FailedPrecondition)
  bool force = false;       // an operator's takeover of a live LID; needs `admin_token`
  std::string admin_token;  // the operator's secret
};

// Reports one member may make at once, and per second after that (a token bucket).
inline constexpr double kReportBurst = 8;
inline constexpr double kReportsPerSecond = 2;

// Who sends a LEAVE or REPORT_FAILED, as far as the request proves it.
struct Caller {
  std::string credential;         // LEAVE: the holder's credential of the LID
  std::string admin_token;        // the operator's secret
  std::optional<Lid> member;      // REPORT_FAILED: a LID the reporter holds ...
  std::string member_credential;  // ... and its credential
  std::string name;               // free text naming the reporter (logs and the FAILED reason)
};

// The rules of membership, shared by every backend (docs/design/protocol.md, "Credentials"):
// - Each JOIN that creates an incarnation returns a fresh credential; HEARTBEAT, LEAVE and a
//   migration (a JOIN of the held LID with new addresses) must present it.
// - A JOIN of a LID whose holder's lease is live is refused (AlreadyExists, naming the epoch),
//   unless forced with the admin token; the displaced holder is then fenced (FAILED superseded).
// - REPORT_FAILED is accepted from a live member of the same model (it presents the credential of
//   a LID it holds) or with the admin token; LEAVE from the holder or with the admin token.
// - A member reports only about the groups it deals with, when its record says which
//   (metadata kPeerGroupsKey: "1,2,3"; every pp stage publishes it), and at most kReportBurst
//   reports at once, kReportsPerSecond on average (ResourceExhausted past that): one member
//   cannot evict a model's every stage. The operator's reports are not limited.
class Registry {
 public:
  Registry(Clock* clock, RegistryOptions options);

  struct JoinResult {
    uint64_t epoch = 0;
    std::string credential;  // of this incarnation; present it in HEARTBEAT, LEAVE, migrations
    bool changed = false;    // false: an idempotent retry of the holder's own JOIN
  };
  // Registers `lid`. With the holder's credential: the same addresses and metadata are an
  // idempotent retry, others a migration (new epoch, new credential, MIGRATED). Without it:
  // AlreadyExists while the holder's lease is live (FailedPrecondition when `exclusive`), unless
  // `force` with the admin token (PermissionDenied with a wrong one).
  absl::StatusOr<JoinResult> Join(const Lid& lid, const std::vector<std::string>& addresses,
                                  const std::map<std::string, std::string>& metadata,
                                  const JoinAuth& auth = {});

  struct HeartbeatResult {
    uint64_t epoch = 0;
    std::string credential;  // non-empty when the holder must adopt a later incarnation
  };
  // Renews the lease of (lid, epoch) for the holder of `credential`. FailedPrecondition: another
  // epoch holds the LID, or this one was superseded or left (stop claiming the LID).
  // PermissionDenied: the credential is not that epoch's. NotFound: the epoch was evicted or is
  // unknown, and nobody holds the LID (join again). Presented with the previous incarnation's
  // credential (a migration whose reply was lost), it returns the current epoch and credential.
  absl::StatusOr<HeartbeatResult> Heartbeat(const Lid& lid, uint64_t epoch,
                                            std::string_view credential);

  // Graceful leave by the holder (`caller.credential`), or an operator's drain
  // (`caller.admin_token`). `epoch` 0 means whatever epoch holds the LID.
  absl::Status Leave(const Lid& lid, uint64_t epoch, const Caller& caller);

  // Evicts (lid, epoch) for everyone; `epoch` 0 means the current one. Returns false when that
  // epoch no longer holds the LID (nothing to do). NotFound for a LID that is not registered;
  // PermissionDenied unless the caller is a live member of the LID's model or the operator.
  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch, const Caller& caller);

  // Evicts every record whose lease ran out (FAILED, reason lease-expired).
  void ExpireLeases();

  // Milliseconds until the next lease runs out (nullopt when there are no records).
  std::optional<int64_t> MsUntilNextExpiry() const;

  // Records, optionally only those of `model` (and `group`), sorted by LID.
  Snapshot Snap(uint64_t incarnation, std::optional<std::string> model = std::nullopt,
                std::optional<uint32_t> group = std::nullopt) const;

  // Events produced since the last call, in revision order.
  std::vector<Event> TakeEvents();

  // The durable part of the state, and its restoration into a fresh registry: epochs continue
  // from `state.next_epoch` (never below the options' first_epoch), revisions from
  // `state.revision`, and every record comes back with a full lease (the holder had no way to
  // renew it while the directory was down), emitting no event.
  RegistryState Export() const;
  void Restore(const RegistryState& state);

  uint64_t next_epoch() const { return next_epoch_; }
  uint64_t revision() const { return revision_; }
  // The revision of `model`'s latest event (what a watcher of that model alone has seen when it
  // is up to date): every event carries the one before it (`Event::model_previous`), so that a
  // watcher subscribed to one model finds a gap without seeing the other models' events.
  // Models without a known latest event answer a floor no event of theirs was lost below.
  uint64_t ModelRevision(std::string_view model) const;
  // Every model with a known latest event and that revision (the per-model ticks).
  const std::map<std::string, uint64_t, std::less<>>& model_revisions() const {
    return model_revision_;
  }
  size_t size() const { return records_.size(); }
  int64_t lease_ttl_ms() const { return options_.lease_ttl_ms; }

 private:
  struct Entry {
    Record record;
    std::string credential;
    // The incarnation before the last migration (0: any) and its credential: answers the
    // heartbeat of a holder whose JOIN was applied but whose reply was lost.
    uint64_t previous_epoch = 0;
    std::string previous_credential;
    int64_t deadline_ms = 0;
  };
  enum class Ended { kLeft, kFailed, kSuperseded };

  void Emit(EventKind kind, const Record& record, uint64_t previous_epoch, std::string reason);
  void Tombstone(const Lid& lid, uint64_t epoch, Ended how);
  Record WithLease(const Entry& entry) const;
  // OK when `token` is the admin token; PermissionDenied naming `what` otherwise.
  absl::Status CheckAdmin(std::string_view token, std::string_view what) const;
  bool IsAdmin(std::string_view token) const;
  // Removes `it` from the table (and from the per-model count); returns the next iterator.
  std::map<Lid, Entry>::iterator Erase(std::map<Lid, Entry>::iterator it);
  // Ends an entry whose lease ran out (FAILED lease-expired); returns the next iterator.
  std::map<Lid, Entry>::iterator Expire(std::map<Lid, Entry>::iterator it);

  Clock* clock_;
  RegistryOptions options_;
  uint64_t next_epoch_;
  uint64_t revision_ = 0;
  std::map<Lid, Entry> records_;
  std::map<std::string, size_t, std::less<>> records_per_model_;
  // Per model, the revision of its latest event; bounded: models without records are forgotten
  // once the map outgrows max_records, raising the floor that forgotten models answer.
  std::map<std::string, uint64_t, std::less<>> model_revision_;
  uint64_t model_revision_floor_ = 0;
  std::map<std::pair<Lid, uint64_t>, Ended> tombstones_;
  // Per reporting member (a live LID): its report budget and when it was last filled. Dropped with
  // the member's record.
  struct ReportBudget {
    double tokens = kReportBurst;
    int64_t at_ms = -1;  // -1: never used
  };
  std::map<Lid, ReportBudget> report_budgets_;
  std::deque<std::pair<Lid, uint64_t>> tombstone_order_;
  std::vector<Event> pending_;
};

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_REGISTRY_H_
