#include "connex/directory/protocol.h"

#include "absl/strings/cord.h"
#include "connex/base/codec.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::directory {

std::string_view EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kJoined:
      return "JOINED";
    case EventKind::kLeft:
      return "LEFT";
    case EventKind::kFailed:
      return "FAILED";
    case EventKind::kMigrated:
      return "MIGRATED";
  }
  return "UNKNOWN";
}

absl::StatusOr<EventKind> ParseEventKind(std::string_view name) {
  if (name == "JOINED") return EventKind::kJoined;
  if (name == "LEFT") return EventKind::kLeft;
  if (name == "FAILED") return EventKind::kFailed;
  if (name == "MIGRATED") return EventKind::kMigrated;
  return absl::InvalidArgumentError(StrCat("unknown event kind '", name, "'"));
}

void ApplyEventToView(const Event& event, std::map<Lid, Record>* view) {
  const Lid& lid = event.record.lid;
  switch (event.kind) {
    case EventKind::kJoined:
    case EventKind::kMigrated:
      (*view)[lid] = event.record;
      break;
    case EventKind::kLeft:
    case EventKind::kFailed: {
      auto it = view->find(lid);
      if (it != view->end() && it->second.epoch == event.record.epoch) view->erase(it);
      break;
    }
  }
}

std::vector<Event> EventsBetweenViews(const std::map<Lid, Record>& before,
                                      const std::map<Lid, Record>& after, uint64_t revision,
                                      const std::function<bool(const Lid&)>& in_scope) {
  std::vector<Event> events;
  for (const auto& [lid, old] : before) {
    if (!in_scope(lid)) continue;
    auto it = after.find(lid);
    if (it == after.end() || it->second.epoch != old.epoch) {
      Event e;
      e.revision = revision;
      e.kind = EventKind::kFailed;
      e.record = old;
      e.reason = "gone (seen in a fresh snapshot)";
      events.push_back(std::move(e));
    }
  }
  for (const auto& [lid, record] : after) {
    auto it = before.find(lid);
    if (it == before.end() || it->second.epoch != record.epoch) {
      Event e;
      e.revision = revision;
      e.kind = EventKind::kJoined;
      e.record = record;
      events.push_back(std::move(e));
    }
  }
  return events;
}

void EncodeRecord(const Record& record, wire::MapBuilder* out) {
  out->Str("lid", record.lid.ToString())
      .Uint("epoch", record.epoch)
      .StrList("addresses", record.addresses)
      .StrMap("metadata", record.metadata)
      .Int("lease_left_ms", record.lease_left_ms);
}

absl::StatusOr<Record> DecodeRecord(const wire::MapView& in) {
  Record record;
  CONNEX_ASSIGN_OR_RETURN(std::string lid_text, in.Str("lid"));
  absl::StatusOr<Lid> lid = Lid::Parse(lid_text);
  if (!lid.ok()) return Annotate(lid.status(), StrCat(in.path(), ".lid"));
  record.lid = *std::move(lid);
  CONNEX_ASSIGN_OR_RETURN(record.epoch, in.Uint("epoch"));
  CONNEX_ASSIGN_OR_RETURN(record.addresses, in.StrList("addresses"));
  if (in.Has("metadata")) {
    CONNEX_ASSIGN_OR_RETURN(record.metadata, in.StrMap("metadata"));
  }
  if (in.Has("lease_left_ms")) {
    CONNEX_ASSIGN_OR_RETURN(record.lease_left_ms, in.Int("lease_left_ms"));
  }
  return record;
}

void EncodeEvent(const Event& event, uint64_t incarnation, wire::MapBuilder* out) {
  wire::MapBuilder record;
  EncodeRecord(event.record, &record);
  out->Uint("incarnation", incarnation)
      .Uint("revision", event.revision)
      .Str("kind", EventKindName(event.kind))
      .Map("record", record)
      .Uint("previous_epoch", event.previous_epoch)
      .Str("reason", event.reason)
      .Uint("model_previous", event.model_previous);
}

absl::StatusOr<Event> DecodeEvent(const wire::MapView& in) {
  Event event;
  CONNEX_ASSIGN_OR_RETURN(event.revision, in.Uint("revision"));
  CONNEX_ASSIGN_OR_RETURN(std::string kind, in.Str("kind"));
  absl::StatusOr<EventKind> parsed = ParseEventKind(kind);
  if (!parsed.ok()) return Annotate(parsed.status(), StrCat(in.path(), ".kind"));
  event.kind = *parsed;
  CONNEX_ASSIGN_OR_RETURN(wire::MapView record, in.Map("record"));
  CONNEX_ASSIGN_OR_RETURN(event.record, DecodeRecord(record));
  CONNEX_ASSIGN_OR_RETURN(event.previous_epoch, in.UintOr("previous_epoch", 0));
  CONNEX_ASSIGN_OR_RETURN(event.reason, in.StrOr("reason", ""));
  CONNEX_ASSIGN_OR_RETURN(event.model_previous, in.UintOr("model_previous", 0));
  if (event.model_previous >= event.revision) {
    return absl::InvalidArgumentError(StrCat(in.path(), ".model_previous: ", event.model_previous,
                                             " is not below the event's revision ",
                                             event.revision));
  }
  return event;
}

void EncodeSnapshot(const Snapshot& snapshot, wire::MapBuilder* out) {
  wire::ListBuilder records;
  for (const Record& r : snapshot.records) {
    wire::MapBuilder m;
    EncodeRecord(r, &m);
    records.AddMap(m);
  }
  out->Uint("incarnation", snapshot.incarnation)
      .Uint("revision", snapshot.revision)
      .Uint("model_revision", snapshot.model_revision)
      .List("records", records);
}

absl::StatusOr<Snapshot> DecodeSnapshot(const wire::MapView& in) {
  Snapshot snapshot;
  CONNEX_ASSIGN_OR_RETURN(snapshot.incarnation, in.Uint("incarnation"));
  CONNEX_ASSIGN_OR_RETURN(snapshot.revision, in.Uint("revision"));
  CONNEX_ASSIGN_OR_RETURN(snapshot.model_revision, in.UintOr("model_revision", snapshot.revision));
  if (snapshot.model_revision > snapshot.revision) {
    return absl::InvalidArgumentError(StrCat(in.path(),
                                             ".model_revision: ", snapshot.model_revision,
                                             " is above the revision ", snapshot.revision));
  }
  CONNEX_ASSIGN_OR_RETURN(wire::ListView records, in.List("records"));
  snapshot.records.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    CONNEX_ASSIGN_OR_RETURN(wire::MapView m, records.MapAt(i));
    CONNEX_ASSIGN_OR_RETURN(Record r, DecodeRecord(m));
    snapshot.records.push_back(std::move(r));
  }
  return snapshot;
}

absl::Status ValidateRegistration(const std::vector<std::string>& addresses,
                                  const std::map<std::string, std::string>& metadata) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError(
        "addresses: none given (a JOIN publishes at least one SCHEME://... address)");
  }
  if (addresses.size() > kMaxAddresses) {
    return absl::InvalidArgumentError(
        StrCat("addresses: ", addresses.size(), " given, at most ", kMaxAddresses, " allowed"));
  }
  for (const std::string& a : addresses) {
    if (a.empty() || a.size() > kMaxAddressLength) {
      return absl::InvalidArgumentError(
          StrCat("addresses: '", a.substr(0, 64), "' is ", a.empty() ? "empty" : "too long"));
    }
    if (a.find("://") == std::string::npos) {
      return absl::InvalidArgumentError(
          StrCat("addresses: '", a, "' is not self-describing (expected SCHEME://...)"));
    }
  }
  if (metadata.size() > kMaxMetadataEntries) {
    return absl::InvalidArgumentError(
        StrCat("metadata: ", metadata.size(), " entries, at most ", kMaxMetadataEntries));
  }
  for (const auto& [k, v] : metadata) {
    if (k.empty() || k.size() > 128 || v.size() > kMaxMetadataValueLength) {
      return absl::InvalidArgumentError(
          StrCat("metadata: entry '", k.substr(0, 64), "' is too long or empty"));
    }
  }
  return absl::OkStatus();
}

size_t RecordBytes(const Record& record) {
  // Field names, msgpack headers and the integers: at most 64 bytes; each string at most 5
  // bytes of header.
  size_t bytes = 64 + record.lid.ToString().size() + 5;
  for (const std::string& a : record.addresses) bytes += a.size() + 5;
  for (const auto& [k, v] : record.metadata) bytes += k.size() + v.size() + 10;
  return bytes;
}

absl::Status ValidateTableLimits(size_t max_records, size_t max_records_per_model,
                                 size_t max_record_bytes) {
  if (max_records == 0 || max_records_per_model == 0 || max_record_bytes < 256) {
    return absl::InvalidArgumentError(StrCat(
        "--max-records ", max_records, " and --max-records-per-model ", max_records_per_model,
        " must be at least 1, --max-record-bytes ", max_record_bytes, " at least 256"));
  }
  if (max_records * max_record_bytes > kMaxSnapshotBytes) {
    return absl::InvalidArgumentError(StrCat(
        "--max-records ", max_records, " (CONNEX_DIRECTORY_MAX_RECORDS) times --max-record-bytes ",
        max_record_bytes, " (CONNEX_DIRECTORY_MAX_RECORD_BYTES) is ",
        max_records * max_record_bytes, " bytes, over the ", kMaxSnapshotBytes,
        " that a snapshot of every record may take (clients accept 16 MiB frames)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLeaseSettings(int64_t lease_ttl_ms, int64_t heartbeat_ms) {
  if (heartbeat_ms * 2 > lease_ttl_ms) {
    return absl::InvalidArgumentError(
        StrCat("--heartbeat-ms ", heartbeat_ms,
               " (CONNEX_HEARTBEAT_MS) must be at most half of "
               "--lease-ttl-ms ",
               lease_ttl_ms, " (CONNEX_LEASE_TTL_MS): with ", heartbeat_ms,
               " ms between heartbeats a ", lease_ttl_ms, " ms lease expires between two of them"));
  }
  return absl::OkStatus();
}

namespace {
constexpr char kEndedByLeaveUrl[] = "type.connex.dev/directory.ended_by_leave";
}  // namespace

absl::Status EndedByLeaveError(std::string message) {
  absl::Status s = absl::FailedPreconditionError(message);
  s.SetPayload(kEndedByLeaveUrl, absl::Cord("1"));
  return s;
}

bool EndedByLeave(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         status.GetPayload(kEndedByLeaveUrl).has_value();
}

std::string EncodeError(uint64_t request_id, const absl::Status& status) {
  wire::MapBuilder body;
  body.Uint("id", request_id)
      .Uint("code", static_cast<uint64_t>(status.code()))
      .Str("message", AsStd(status.message()));
  if (EndedByLeave(status)) body.Bool("left", true);
  return wire::EncodeFrame(kError, body);
}

absl::Status DecodeError(const wire::MapView& body) {
  absl::StatusOr<uint64_t> code = body.Uint("code");
  absl::StatusOr<std::string> message = body.Str("message");
  if (!code.ok() || !message.ok() || *code == 0 || *code > 16) {
    return absl::InternalError("directory sent a malformed ERROR reply");
  }
  absl::StatusOr<bool> left = body.BoolOr("left", false);
  if (left.ok() && *left && *code == static_cast<uint64_t>(absl::StatusCode::kFailedPrecondition)) {
    return EndedByLeaveError(*message);
  }
  return absl::Status(static_cast<absl::StatusCode>(*code), *message);
}

std::string EventTopic(std::string_view model) { return StrCat(model, "/"); }

}  // namespace connex::directory
