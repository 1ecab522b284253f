#include "connex/directory/registry.h"

#include <algorithm>

#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::directory {

Registry::Registry(Clock* clock, RegistryOptions options)
    : clock_(clock), options_(options), next_epoch_(std::max<uint64_t>(1, options.first_epoch)) {}

Record Registry::WithLease(const Entry& entry) const {
  Record r = entry.record;
  r.lease_left_ms = std::max<int64_t>(0, entry.deadline_ms - clock_->NowMs());
  return r;
}

void Registry::Emit(EventKind kind, const Record& record, uint64_t previous_epoch,
                    std::string reason) {
  Event e;
  e.revision = ++revision_;
  e.kind = kind;
  e.record = record;
  e.previous_epoch = previous_epoch;
  e.reason = std::move(reason);
  pending_.push_back(std::move(e));
}

void Registry::Tombstone(const Lid& lid, uint64_t epoch, Ended how) {
  auto key = std::make_pair(lid, epoch);
  if (tombstones_.insert_or_assign(key, how).second) tombstone_order_.push_back(key);
  while (tombstone_order_.size() > options_.max_tombstones) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
}

absl::StatusOr<Registry::JoinResult> Registry::Join(
    const Lid& lid, const std::vector<std::string>& addresses,
    const std::map<std::string, std::string>& metadata, uint64_t instance, bool exclusive) {
  CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(lid.model));
  CONNEX_RETURN_IF_ERROR(ValidateRegistration(addresses, metadata));
  const int64_t now = clock_->NowMs();
  auto it = records_.find(lid);
  if (it != records_.end() && it->second.instance == instance) {
    Entry& entry = it->second;
    if (entry.record.addresses == addresses && entry.record.metadata == metadata) {
      entry.deadline_ms = now + options_.lease_ttl_ms;
      return JoinResult{entry.record.epoch, false};
    }
    // Migration: same holder, new addresses.
    uint64_t previous = entry.record.epoch;
    Tombstone(lid, previous, Ended::kSuperseded);
    entry.record.epoch = next_epoch_++;
    entry.record.addresses = addresses;
    entry.record.metadata = metadata;
    entry.deadline_ms = now + options_.lease_ttl_ms;
    Emit(EventKind::kMigrated, WithLease(entry), previous, "");
    return JoinResult{entry.record.epoch, true};
  }
  if (it != records_.end() && exclusive) {
    return absl::FailedPreconditionError(StrCat(
        lid.ToString(), " is held by another process (epoch ", it->second.record.epoch, ")"));
  }
  if (it != records_.end()) {
    // Another process takes the LID over: the earlier holder is fenced.
    Record old = WithLease(it->second);
    Tombstone(lid, old.epoch, Ended::kSuperseded);
    records_.erase(it);
    Emit(EventKind::kFailed, old, 0, StrCat("superseded by epoch ", next_epoch_));
  }
  Entry entry;
  entry.record.lid = lid;
  entry.record.epoch = next_epoch_++;
  entry.record.addresses = addresses;
  entry.record.metadata = metadata;
  entry.instance = instance;
  entry.deadline_ms = now + options_.lease_ttl_ms;
  uint64_t epoch = entry.record.epoch;
  Emit(EventKind::kJoined, WithLease(entry), 0, "");
  records_.emplace(lid, std::move(entry));
  return JoinResult{epoch, true};
}

absl::StatusOr<uint64_t> Registry::Heartbeat(const Lid& lid, uint64_t epoch, uint64_t instance) {
  auto it = records_.find(lid);
  if (it != records_.end()) {
    if (it->second.instance == instance && it->second.record.epoch >= epoch) {
      it->second.deadline_ms = clock_->NowMs() + options_.lease_ttl_ms;
      return it->second.record.epoch;
    }
    // Someone else holds the LID now (or holds this epoch): whatever happened to our epoch, it
    // must not come back.
    return absl::FailedPreconditionError(StrCat("epoch ", epoch, " of ", lid.ToString(),
                                                " is superseded by ", it->second.record.epoch));
  }
  auto tomb = tombstones_.find(std::make_pair(lid, epoch));
  if (tomb != tombstones_.end()) {
    switch (tomb->second) {
      case Ended::kSuperseded:
        return absl::FailedPreconditionError(
            StrCat("epoch ", epoch, " of ", lid.ToString(), " is superseded"));
      case Ended::kLeft:
        return absl::FailedPreconditionError(
            StrCat("epoch ", epoch, " of ", lid.ToString(), " has left"));
      case Ended::kFailed:
        return absl::NotFoundError(StrCat("epoch ", epoch, " of ", lid.ToString(), " was evicted"));
    }
  }
  return absl::NotFoundError(StrCat("epoch ", epoch, " of ", lid.ToString(), " is not registered"));
}

absl::Status Registry::Leave(const Lid& lid, uint64_t epoch) {
  auto it = records_.find(lid);
  if (it == records_.end()) {
    return absl::NotFoundError(StrCat(lid.ToString(), " is not registered"));
  }
  if (epoch != 0 && it->second.record.epoch != epoch) {
    return absl::FailedPreconditionError(StrCat("epoch ", epoch, " of ", lid.ToString(),
                                                " is superseded by ", it->second.record.epoch));
  }
  Record old = WithLease(it->second);
  Tombstone(lid, old.epoch, Ended::kLeft);
  records_.erase(it);
  Emit(EventKind::kLeft, old, 0, "");
  return absl::OkStatus();
}

absl::StatusOr<bool> Registry::ReportFailed(const Lid& lid, uint64_t epoch,
                                            std::string_view reporter) {
  auto it = records_.find(lid);
  if (it == records_.end()) {
    return absl::NotFoundError(StrCat(lid.ToString(), " is not registered"));
  }
  if (epoch != 0 && it->second.record.epoch != epoch) return false;
  Record old = WithLease(it->second);
  Tombstone(lid, old.epoch, Ended::kFailed);
  records_.erase(it);
  Emit(EventKind::kFailed, old, 0,
       reporter.empty() ? std::string("reported") : StrCat("reported by ", reporter));
  return true;
}

void Registry::ExpireLeases() {
  const int64_t now = clock_->NowMs();
  for (auto it = records_.begin(); it != records_.end();) {
    if (it->second.deadline_ms <= now) {
      Record old = WithLease(it->second);
      Tombstone(old.lid, old.epoch, Ended::kFailed);
      it = records_.erase(it);
      Emit(EventKind::kFailed, old, 0, "lease-expired");
    } else {
      ++it;
    }
  }
}

std::optional<int64_t> Registry::MsUntilNextExpiry() const {
  if (records_.empty()) return std::nullopt;
  int64_t earliest = INT64_MAX;
  for (const auto& [lid, entry] : records_) earliest = std::min(earliest, entry.deadline_ms);
  return std::max<int64_t>(0, earliest - clock_->NowMs());
}

Snapshot Registry::Snap(uint64_t incarnation, std::optional<std::string> model,
                        std::optional<uint32_t> group) const {
  Snapshot s;
  s.incarnation = incarnation;
  s.revision = revision_;
  for (const auto& [lid, entry] : records_) {
    if (model && lid.model != *model) continue;
    if (group && lid.group != *group) continue;
    s.records.push_back(WithLease(entry));
  }
  return s;
}

std::vector<Event> Registry::TakeEvents() {
  std::vector<Event> out;
  out.swap(pending_);
  return out;
}

}  // namespace connex::directory
