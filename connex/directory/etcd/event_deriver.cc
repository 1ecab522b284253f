// EventDeriver (etcd_store.h): the directory's events (JOINED, LEFT, FAILED, ...) from etcd's
// watch, the events of one revision — one transaction — classified together by the keys they
// touch (the "Events" table of docs/design/etcd.md).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "connex/base/logging.h"
#include "connex/base/strings.h"
#include "connex/directory/etcd/etcd_store.h"

namespace connex::directory::etcd {

std::vector<Event> EventDeriver::Apply(const WatchResponse& response) {
  std::vector<Event> out;
  std::vector<const WatchEvent*> same;
  for (const WatchEvent& event : response.events) {
    if (!same.empty() && same.front()->kv.mod_revision != event.kv.mod_revision) {
      ApplyRevision(same, &out);
      same.clear();
    }
    same.push_back(&event);
  }
  if (!same.empty()) ApplyRevision(same, &out);
  return out;
}

void EventDeriver::ApplyRevision(const std::vector<const WatchEvent*>& events,
                                 std::vector<Event>* out) {
  const uint64_t revision = static_cast<uint64_t>(events.front()->kv.mod_revision);
  if (revision <= last_revision_) return;  // delivered already (the watch resumed before it)
  // How incarnations ended at this revision (the end markers the transaction wrote).
  std::map<Lid, std::string> ends;
  std::vector<std::pair<const WatchEvent*, Lid>> records;
  for (const WatchEvent* event : events) {
    absl::StatusOr<ParsedKey> parsed = ParseKey(event->kv.key);
    if (!parsed.ok()) {
      ++skipped_;
      continue;
    }
    if (parsed->kind == ParsedKey::Kind::kEnd && event->type == WatchEvent::Type::kPut) {
      ends[parsed->lid] = event->kv.value;
    } else if (parsed->kind == ParsedKey::Kind::kRecord) {
      records.emplace_back(event, parsed->lid);
    }
  }
  auto previous_record = [&](const WatchEvent& event, const Lid& lid) {
    Record old;
    old.lid = lid;
    if (event.prev_kv) {
      absl::StatusOr<Record> decoded = DecodeRecordValue(lid, event.prev_kv->value);
      if (decoded.ok()) old = *std::move(decoded);
      old.epoch = static_cast<uint64_t>(event.prev_kv->mod_revision);
    }
    return old;
  };
  auto emit = [&](EventKind kind, Record record, uint64_t previous_epoch, std::string reason) {
    Event e;
    e.revision = revision;
    e.kind = kind;
    e.record = std::move(record);
    e.previous_epoch = previous_epoch;
    e.reason = std::move(reason);
    e.model_previous = last_revision_;
    out->push_back(std::move(e));
  };
  for (const auto& [event, lid] : records) {
    auto end = ends.find(lid);
    if (event->type == WatchEvent::Type::kPut) {
      absl::StatusOr<Record> record = DecodeRecordValue(lid, event->kv.value);
      if (!record.ok()) {
        ++skipped_;
        continue;
      }
      record->epoch = revision;
      const bool superseded = end != ends.end() && end->second.rfind(kEndSupersededPrefix, 0) == 0;
      if (event->kv.version == 1) {
        emit(EventKind::kJoined, *std::move(record), 0, "");
      } else if (superseded) {
        emit(EventKind::kFailed, previous_record(*event, lid), 0,
             StrCat("superseded by epoch ", revision));
        emit(EventKind::kJoined, *std::move(record), 0, "");
      } else {
        emit(EventKind::kMigrated, *std::move(record),
             event->prev_kv ? static_cast<uint64_t>(event->prev_kv->mod_revision) : 0, "");
      }
    } else {
      Record old = previous_record(*event, lid);
      if (end != ends.end() && end->second == kEndLeft) {
        emit(EventKind::kLeft, std::move(old), 0, "");
      } else if (end != ends.end()) {
        emit(EventKind::kFailed, std::move(old), 0, end->second);
      } else {
        emit(EventKind::kFailed, std::move(old), 0, "lease-expired");
      }
    }
  }
  last_revision_ = revision;
}

}  // namespace connex::directory::etcd
