// The directory protocol: records, events and the encoding of requests, replies and events as
// wire frames (connex/base/codec.h). docs/design/protocol.md describes the same thing for people;
// keep the two in step. Value types; thread-compatible.
#ifndef CONNEX_DIRECTORY_PROTOCOL_H_
#define CONNEX_DIRECTORY_PROTOCOL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/lid.h"

// The wire encoding (connex/base/codec.h, msgpack) is needed only where frames are built or
// read: the value types below do not carry it into every file that includes them.
namespace connex::wire {
class MapBuilder;
class MapView;
}  // namespace connex::wire

namespace connex::directory {

// Request frame types (client -> server, over DEALER/REQ -> ROUTER).
inline constexpr std::string_view kJoin = "JOIN";
inline constexpr std::string_view kLeave = "LEAVE";
inline constexpr std::string_view kHeartbeat = "HEARTBEAT";
inline constexpr std::string_view kReportFailed = "REPORT_FAILED";

// A record's metadata key listing the groups its holder exchanges work with ("0,2"): the embedded
// directory refuses its failure reports about any other group (Registry::ReportFailed).
inline constexpr std::string_view kPeerGroupsKey = "peer_groups";
inline constexpr std::string_view kSnapshot = "SNAPSHOT";
inline constexpr std::string_view kHello = "HELLO";
// Reply frame types (server -> client).
inline constexpr std::string_view kOk = "OK";
inline constexpr std::string_view kError = "ERROR";
// Frames on the PUB socket.
inline constexpr std::string_view kEvent = "EVENT";
inline constexpr std::string_view kTick = "TICK";
// PUB topic of the directory-wide TICK (incarnation and revision). Events of a model use the
// topic `<model>/`, and so does that model's TICK (with `model` and `model_revision`): a watcher
// of one model subscribes to `<model>/` and `~` and receives nothing of other models.
inline constexpr std::string_view kTickTopic = "~";

// Events the PUB socket queues per subscriber before it drops that subscriber's events (which
// then resynchronises from a snapshot: it sees the gap in the next tick). With records of at most
// kDefaultMaxRecordBytes this bounds a slow or stopped subscriber's backlog to about 8 MiB.
inline constexpr int kPubHighWaterMark = 1000;

// Replies the server has handed to ZeroMQ that have not yet left for the network, in bytes: a
// client that asks and never reads would otherwise make the directory queue its replies (up to
// ZeroMQ's 1000 messages a connection, each snapshot up to a frame's 16 MiB). Above the first
// limit a connection's SNAPSHOTs are refused (ResourceExhausted) until it reads; above the second,
// over every connection, SNAPSHOTs are refused for now (Unavailable; a watcher retries with
// backoff). Other requests are never refused for it: their replies are small.
inline constexpr int64_t kMaxUnreadBytesPerConnection = 4 << 20;
inline constexpr int64_t kMaxUnreadBytes = 256 << 20;
// SNAPSHOTs waiting to be served (they are served after the cheap requests of each turn, within a
// time budget, so that no flood of them delays a heartbeat); more are refused (Unavailable).
inline constexpr size_t kMaxPendingSnapshots = 16384;

// Largest request the server accepts (ZMQ_MAXMSGSIZE on its ROUTER socket): the smaller of this
// and the largest valid JOIN, a record of max_record_bytes plus kRequestEnvelopeBytes.
inline constexpr int64_t kMaxRequestBytes = 1 << 20;
inline constexpr int64_t kRequestEnvelopeBytes = 16 << 10;  // token, credential, names, ids
// Limits on fields of a record.
inline constexpr size_t kMaxAddresses = 16;
inline constexpr size_t kMaxAddressLength = 512;
inline constexpr size_t kMaxMetadataEntries = 32;
inline constexpr size_t kMaxMetadataValueLength = 4096;

// One registered endpoint.
struct Record {
  Lid lid;
  uint64_t epoch = 0;
  std::vector<std::string> addresses;
  std::map<std::string, std::string> metadata;
  int64_t lease_left_ms = 0;  // at the time the server encoded the record
  friend bool operator==(const Record&, const Record&) = default;
};

enum class EventKind { kJoined, kLeft, kFailed, kMigrated };
std::string_view EventKindName(EventKind kind);  // JOINED LEFT FAILED MIGRATED
absl::StatusOr<EventKind> ParseEventKind(std::string_view name);

struct Event {
  uint64_t revision = 0;
  EventKind kind = EventKind::kJoined;
  Record record;                // the record joined/migrated to, or the one that left/failed
  uint64_t previous_epoch = 0;  // MIGRATED: the epoch before the migration
  std::string reason;           // FAILED: lease-expired, reported, superseded
  // The revision of the previous event of the same model (or a floor no event of the model was
  // lost below): a watcher of one model applies an event when this is at most the revision it
  // has seen of that model, and takes a fresh snapshot when it is above (a gap).
  uint64_t model_previous = 0;
};

// A consistent view at `revision` of directory incarnation `incarnation`.
struct Snapshot {
  uint64_t incarnation = 0;
  uint64_t revision = 0;
  // Of a snapshot of one model: the revision of that model's latest event (Event::model_previous
  // of its next one); of a whole snapshot, `revision`.
  uint64_t model_revision = 0;
  std::vector<Record> records;
};

// What changed between two views of the same records as seen by a watcher that missed the
// events in between (a gap, a compacted history, a directory restart): FAILED ("gone (seen in a
// fresh snapshot)") for each record of `before` that `after` lacks or has under another epoch,
// then JOINED for each record of `after` that is new or has a new epoch, all at `revision`.
// Records of `before` for which `in_scope` is false are not compared (another scope's).
std::vector<Event> EventsBetweenViews(const std::map<Lid, Record>& before,
                                      const std::map<Lid, Record>& after, uint64_t revision,
                                      const std::function<bool(const Lid&)>& in_scope);

// Applies `event` to a watcher's view: JOINED and MIGRATED set the record; LEFT and FAILED remove
// it if it is still of that epoch (a later epoch's record stays).
void ApplyEventToView(const Event& event, std::map<Lid, Record>* view);

// Field names and (de)serialisation of the shared structures.
void EncodeRecord(const Record& record, wire::MapBuilder* out);
absl::StatusOr<Record> DecodeRecord(const wire::MapView& in);
void EncodeEvent(const Event& event, uint64_t incarnation, wire::MapBuilder* out);
absl::StatusOr<Event> DecodeEvent(const wire::MapView& in);
void EncodeSnapshot(const Snapshot& snapshot, wire::MapBuilder* out);
absl::StatusOr<Snapshot> DecodeSnapshot(const wire::MapView& in);

// Default limits of a directory's table (DirectoryServerOptions, RegistryOptions). Chosen so
// that a snapshot of every record (at most kDefaultMaxRecords * kDefaultMaxRecordBytes, 8 MiB)
// fits the 16 MiB frame that clients accept.
inline constexpr size_t kDefaultMaxRecords = 1024;
inline constexpr size_t kDefaultMaxRecordsPerModel = 256;
inline constexpr size_t kDefaultMaxRecordBytes = 8192;
// A snapshot of max_records records of max_record_bytes each must stay below this.
inline constexpr size_t kMaxSnapshotBytes = 12 << 20;

// An upper bound of the encoded size of `record` (msgpack), for the record-size limit.
size_t RecordBytes(const Record& record);

// Validates the table limits: InvalidArgument naming the values (and their flags) when a
// snapshot of every record could exceed kMaxSnapshotBytes or a limit is zero.
absl::Status ValidateTableLimits(size_t max_records, size_t max_records_per_model,
                                 size_t max_record_bytes);

// Validates what a JOIN registers; InvalidArgument names the bad field.
absl::Status ValidateRegistration(const std::vector<std::string>& addresses,
                                  const std::map<std::string, std::string>& metadata);

// The heartbeat period must be at most half the lease TTL, so that a lease survives one lost
// heartbeat. InvalidArgument naming both values (and their flags) otherwise.
absl::Status ValidateLeaseSettings(int64_t lease_ttl_ms, int64_t heartbeat_ms);

// An ERROR reply carries an absl status code and message.
std::string EncodeError(uint64_t request_id, const absl::Status& status);
// An epoch that ended by a LEAVE — its holder's own, or an operator's drain — refused as no
// longer held: FailedPrecondition, marked so that a client tells it from a superseded epoch
// without reading the message (the mark travels in ERROR as `left: true`).
absl::Status EndedByLeaveError(std::string message);
bool EndedByLeave(const absl::Status& status);
absl::Status DecodeError(const wire::MapView& body);

// PUB topic of events of `model`.
std::string EventTopic(std::string_view model);

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_PROTOCOL_H_
