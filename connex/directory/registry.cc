#include "connex/directory/registry.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/directory/secret.h"

namespace connex::directory {

Registry::Registry(Clock* clock, RegistryOptions options)
    : clock_(clock),
      options_(std::move(options)),
      next_epoch_(std::max<uint64_t>(1, options_.first_epoch)) {
  if (!options_.new_credential) options_.new_credential = NewCredential;
}

Record Registry::WithLease(const Entry& entry) const {
  Record r = entry.record;
  r.lease_left_ms = std::max<int64_t>(0, entry.deadline_ms - clock_->NowMs());
  return r;
}

void Registry::Emit(EventKind kind, const Record& record, uint64_t previous_epoch,
                    std::string reason) {
  Event e;
  e.revision = ++revision_;
  e.model_previous = ModelRevision(record.lid.model);
  model_revision_[record.lid.model] = e.revision;
  if (model_revision_.size() > options_.max_records) {
    // Forget models that hold no record; what they answer from now on (the floor) is at least
    // their latest event, so a watcher behind them still sees a gap.
    for (auto it = model_revision_.begin(); it != model_revision_.end();) {
      if (records_per_model_.count(it->first) == 0 && it->first != record.lid.model) {
        model_revision_floor_ = std::max(model_revision_floor_, it->second);
        it = model_revision_.erase(it);
      } else {
        ++it;
      }
    }
  }
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

bool Registry::IsAdmin(std::string_view token) const {
  return SecretsEqual(token, options_.admin_token);
}

absl::Status Registry::CheckAdmin(std::string_view token, std::string_view what) const {
  if (options_.admin_token.empty()) {
    return absl::PermissionDeniedError(
        StrCat(what,
               " needs the admin token, and this directory has none (start it with "
               "--admin-token-file or CONNEX_DIRECTORY_ADMIN_TOKEN)"));
  }
  if (token.empty()) return absl::PermissionDeniedError(StrCat(what, " needs the admin token"));
  if (!IsAdmin(token)) return absl::PermissionDeniedError(StrCat(what, ": wrong admin token"));
  return absl::OkStatus();
}

std::map<Lid, Registry::Entry>::iterator Registry::Erase(std::map<Lid, Entry>::iterator it) {
  report_budgets_.erase(it->first);
  auto count = records_per_model_.find(it->first.model);
  if (count != records_per_model_.end() && --count->second == 0) records_per_model_.erase(count);
  return records_.erase(it);
}

std::map<Lid, Registry::Entry>::iterator Registry::Expire(std::map<Lid, Entry>::iterator it) {
  Record old = WithLease(it->second);
  Tombstone(old.lid, old.epoch, Ended::kFailed);
  it = Erase(it);
  Emit(EventKind::kFailed, old, 0, "lease-expired");
  return it;
}

absl::StatusOr<Registry::JoinResult> Registry::Join(
    const Lid& lid, const std::vector<std::string>& addresses,
    const std::map<std::string, std::string>& metadata, const JoinAuth& auth) {
  CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(lid.model));
  CONNEX_RETURN_IF_ERROR(ValidateRegistration(addresses, metadata));
  {
    Record candidate;
    candidate.lid = lid;
    candidate.addresses = addresses;
    candidate.metadata = metadata;
    size_t bytes = RecordBytes(candidate);
    if (bytes > options_.max_record_bytes) {
      return absl::InvalidArgumentError(StrCat(
          "the record takes ", bytes, " bytes, over the limit of ", options_.max_record_bytes,
          " (--max-record-bytes, CONNEX_DIRECTORY_MAX_RECORD_BYTES): shorten its metadata"));
    }
  }
  const int64_t now = clock_->NowMs();
  auto it = records_.find(lid);
  // A lease that ran out since the last sweep is over: the LID is free. (Expire returns the
  // record after it, another LID's.)
  if (it != records_.end() && it->second.deadline_ms <= now) {
    Expire(it);
    it = records_.end();
  }
  if (it != records_.end() && SecretsEqual(auth.credential, it->second.credential)) {
    Entry& entry = it->second;
    if (entry.record.addresses == addresses && entry.record.metadata == metadata) {
      entry.deadline_ms = now + options_.lease_ttl_ms;
      return JoinResult{entry.record.epoch, entry.credential, false};
    }
    // Migration: same holder, new addresses; a new incarnation with its own credential.
    uint64_t previous = entry.record.epoch;
    Tombstone(lid, previous, Ended::kSuperseded);
    entry.previous_epoch = previous;
    entry.previous_credential = std::move(entry.credential);
    entry.credential = options_.new_credential();
    entry.record.epoch = next_epoch_++;
    entry.record.addresses = addresses;
    entry.record.metadata = metadata;
    entry.deadline_ms = now + options_.lease_ttl_ms;
    Emit(EventKind::kMigrated, WithLease(entry), previous, "");
    return JoinResult{entry.record.epoch, entry.credential, true};
  }
  if (it != records_.end()) {
    const Entry& held = it->second;
    if (auth.force) {
      CONNEX_RETURN_IF_ERROR(CheckAdmin(auth.admin_token, "a forced JOIN"));
      // The operator takes the LID over: the earlier holder is fenced.
      Record old = WithLease(held);
      Tombstone(lid, old.epoch, Ended::kSuperseded);
      Erase(it);
      Emit(EventKind::kFailed, old, 0, StrCat("superseded by epoch ", next_epoch_));
    } else if (auth.exclusive) {
      return absl::FailedPreconditionError(
          StrCat("held by another process (epoch ", held.record.epoch, ")"));
    } else {
      return absl::AlreadyExistsError(StrCat("held by epoch ", held.record.epoch, " (lease live, ",
                                             held.deadline_ms - now,
                                             " ms left; only its holder may change it, or an "
                                             "operator with `connexctl join --force`)"));
    }
  }
  // A new record: within the limits? (A migration or a takeover replaces one.)
  auto in_model = records_per_model_.find(lid.model);
  size_t model_count = in_model == records_per_model_.end() ? 0 : in_model->second;
  if (model_count >= options_.max_records_per_model) {
    return absl::ResourceExhaustedError(
        StrCat("model '", lid.model, "' has ", model_count, " records, the limit (",
               "--max-records-per-model, CONNEX_DIRECTORY_MAX_RECORDS_PER_MODEL)"));
  }
  if (records_.size() >= options_.max_records) {
    return absl::ResourceExhaustedError(StrCat("the directory has ", records_.size(),
                                               " records, the limit (--max-records, ",
                                               "CONNEX_DIRECTORY_MAX_RECORDS)"));
  }
  Entry entry;
  entry.record.lid = lid;
  entry.record.epoch = next_epoch_++;
  entry.record.addresses = addresses;
  entry.record.metadata = metadata;
  entry.credential = options_.new_credential();
  // A caller that presents a credential of the free LID held it before (a rejoin after eviction
  // or a restart of the directory): should this reply be lost, its heartbeat of the old epoch
  // still finds the new incarnation.
  entry.previous_credential = auth.credential;
  entry.deadline_ms = now + options_.lease_ttl_ms;
  JoinResult result{entry.record.epoch, entry.credential, true};
  Emit(EventKind::kJoined, WithLease(entry), 0, "");
  records_.emplace(lid, std::move(entry));
  ++records_per_model_[lid.model];
  return result;
}

absl::StatusOr<Registry::HeartbeatResult> Registry::Heartbeat(const Lid& lid, uint64_t epoch,
                                                              std::string_view credential) {
  auto it = records_.find(lid);
  if (it != records_.end()) {
    Entry& entry = it->second;
    if (epoch == entry.record.epoch && SecretsEqual(credential, entry.credential)) {
      entry.deadline_ms = clock_->NowMs() + options_.lease_ttl_ms;
      return HeartbeatResult{entry.record.epoch, ""};
    }
    if ((entry.previous_epoch == 0 || epoch == entry.previous_epoch) &&
        SecretsEqual(credential, entry.previous_credential)) {
      // The holder migrated but never heard the reply: it adopts the current incarnation.
      entry.deadline_ms = clock_->NowMs() + options_.lease_ttl_ms;
      return HeartbeatResult{entry.record.epoch, entry.credential};
    }
    if (epoch == entry.record.epoch) {
      return absl::PermissionDeniedError(
          StrCat("wrong credential for epoch ", epoch, " of ", lid.ToString()));
    }
    // Someone else holds the LID now (or holds this epoch): whatever happened to our epoch, it
    // must not come back.
    return absl::FailedPreconditionError(
        StrCat("epoch ", epoch, " of ", lid.ToString(), " is superseded by ", entry.record.epoch));
  }
  auto tomb = tombstones_.find(std::make_pair(lid, epoch));
  if (tomb != tombstones_.end()) {
    switch (tomb->second) {
      case Ended::kSuperseded:
        return absl::FailedPreconditionError(
            StrCat("epoch ", epoch, " of ", lid.ToString(), " is superseded"));
      case Ended::kLeft:
        return EndedByLeaveError(StrCat("epoch ", epoch, " of ", lid.ToString(), " has left"));
      case Ended::kFailed:
        return absl::NotFoundError(StrCat("epoch ", epoch, " of ", lid.ToString(), " was evicted"));
    }
  }
  return absl::NotFoundError(StrCat("epoch ", epoch, " of ", lid.ToString(), " is not registered"));
}

absl::Status Registry::Leave(const Lid& lid, uint64_t epoch, const Caller& caller) {
  auto it = records_.find(lid);
  if (it == records_.end()) {
    return absl::NotFoundError(StrCat(lid.ToString(), " is not registered"));
  }
  const Entry& entry = it->second;
  bool holder = SecretsEqual(caller.credential, entry.credential);
  if (epoch != 0 && entry.record.epoch != epoch) {
    return absl::FailedPreconditionError(
        StrCat("epoch ", epoch, " of ", lid.ToString(), " is superseded by ", entry.record.epoch));
  }
  if (!holder) {
    if (caller.admin_token.empty()) {
      return absl::PermissionDeniedError(
          caller.credential.empty()
              ? "needs the holder's credential (or the admin token, for an operator's drain)"
              : StrCat("the credential is not that of epoch ", entry.record.epoch));
    }
    CONNEX_RETURN_IF_ERROR(CheckAdmin(caller.admin_token, "a drain of another's LID"));
    CONNEX_LOG_INFO("directory: {} epoch {} drained by the operator{}", lid.ToString(),
                    entry.record.epoch, caller.name.empty() ? "" : StrCat(" (", caller.name, ")"));
  }
  Record old = WithLease(entry);
  Tombstone(lid, old.epoch, Ended::kLeft);
  Erase(it);
  Emit(EventKind::kLeft, old, 0, "");
  return absl::OkStatus();
}

absl::StatusOr<bool> Registry::ReportFailed(const Lid& lid, uint64_t epoch, const Caller& caller) {
  // Who reports: a live member of the same model, or the operator.
  std::string who;
  bool as_member = false;
  if (caller.member) {
    auto member = records_.find(*caller.member);
    if (caller.member->model == lid.model && member != records_.end() &&
        member->second.deadline_ms > clock_->NowMs() &&
        SecretsEqual(caller.member_credential, member->second.credential)) {
      who = StrCat(caller.member->ToString(), " epoch ", member->second.record.epoch);
      as_member = true;
    }
  }
  if (who.empty() && !caller.admin_token.empty()) {
    CONNEX_RETURN_IF_ERROR(CheckAdmin(caller.admin_token, "a report from outside the model"));
    who = "the operator";
  }
  if (who.empty()) {
    return absl::PermissionDeniedError(
        StrCat("accepted only from a live member of model '", lid.model,
               "' (the credential of a LID it holds) or with the admin token; reporter '",
               caller.name, "'",
               caller.member ? StrCat(" presented ", caller.member->ToString(),
                                      ", not a live LID "
                                      "of the model that it holds")
                             : StrCat(" holds no LID")));
  }
  if (as_member) {
    // A member: only about a group it deals with, and within its budget.
    const Record& reporter = records_.at(*caller.member).record;
    auto groups = reporter.metadata.find(std::string(kPeerGroupsKey));
    if (groups != reporter.metadata.end()) {
      bool listed = false;
      for (absl::string_view g : absl::StrSplit(groups->second, ',')) {
        uint32_t value = 0;
        listed |= absl::SimpleAtoi(g, &value) && value == lid.group;
      }
      if (!listed) {
        return absl::PermissionDeniedError(
            StrCat(who, " deals with groups ", groups->second, " of model '", lid.model,
                   "' only: its report about ", lid.ToString(), " is refused"));
      }
    }
    const int64_t now = clock_->NowMs();
    ReportBudget& budget = report_budgets_[*caller.member];
    if (budget.at_ms >= 0) {
      budget.tokens =
          std::min(kReportBurst, budget.tokens + static_cast<double>(now - budget.at_ms) *
                                                     kReportsPerSecond / 1000.0);
    }
    budget.at_ms = now;
    if (budget.tokens < 1) {
      return absl::ResourceExhaustedError(StrCat(
          who, " reports too often (more than ", kReportBurst, " at once, ", kReportsPerSecond,
          " a second after that): its report about ", lid.ToString(), " is refused; retry later"));
    }
    budget.tokens -= 1;
  }
  auto it = records_.find(lid);
  if (it == records_.end()) {
    return absl::NotFoundError(StrCat(lid.ToString(), " is not registered"));
  }
  if (epoch != 0 && it->second.record.epoch != epoch) return false;
  Record old = WithLease(it->second);
  // The reporter's own name, unless it only repeats the member's LID.
  std::string name =
      caller.name.empty() || (caller.member && caller.name == caller.member->ToString())
          ? ""
          : StrCat(" (", caller.name, ")");
  CONNEX_LOG_WARN("directory: {} epoch {} reported failed by {}{}", lid.ToString(), old.epoch, who,
                  name);
  Tombstone(lid, old.epoch, Ended::kFailed);
  Erase(it);
  Emit(EventKind::kFailed, old, 0, StrCat("reported by ", who, name));
  return true;
}

void Registry::ExpireLeases() {
  const int64_t now = clock_->NowMs();
  for (auto it = records_.begin(); it != records_.end();) {
    if (it->second.deadline_ms <= now) {
      it = Expire(it);
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

uint64_t Registry::ModelRevision(std::string_view model) const {
  auto it = model_revision_.find(model);
  return it == model_revision_.end() ? model_revision_floor_ : it->second;
}

Snapshot Registry::Snap(uint64_t incarnation, std::optional<std::string> model,
                        std::optional<uint32_t> group) const {
  Snapshot s;
  s.incarnation = incarnation;
  s.revision = revision_;
  s.model_revision = model ? ModelRevision(*model) : revision_;
  for (const auto& [lid, entry] : records_) {
    if (model && lid.model != *model) continue;
    if (group && lid.group != *group) continue;
    s.records.push_back(WithLease(entry));
  }
  return s;
}

RegistryState Registry::Export() const {
  RegistryState state;
  state.next_epoch = next_epoch_;
  state.revision = revision_;
  state.entries.reserve(records_.size());
  for (const auto& [lid, entry] : records_) {
    RegistryState::Entry e;
    e.record = entry.record;
    e.record.lease_left_ms = 0;
    e.credential = entry.credential;
    e.previous_epoch = entry.previous_epoch;
    e.previous_credential = entry.previous_credential;
    state.entries.push_back(std::move(e));
  }
  return state;
}

void Registry::Restore(const RegistryState& state) {
  next_epoch_ = std::max(next_epoch_, state.next_epoch);
  revision_ = std::max(revision_, state.revision);
  // Per-model revisions are not kept: every model answers the restored revision, at least its
  // latest event (a watcher that was behind still sees a gap; one that was not re-reads an
  // unchanged snapshot, which emits nothing).
  model_revision_.clear();
  model_revision_floor_ = revision_;
  const int64_t deadline = clock_->NowMs() + options_.lease_ttl_ms;
  for (const RegistryState::Entry& e : state.entries) {
    next_epoch_ = std::max(next_epoch_, e.record.epoch + 1);
    Entry entry;
    entry.record = e.record;
    entry.credential = e.credential;
    entry.previous_epoch = e.previous_epoch;
    entry.previous_credential = e.previous_credential;
    entry.deadline_ms = deadline;
    if (records_.insert_or_assign(e.record.lid, std::move(entry)).second) {
      ++records_per_model_[e.record.lid.model];
    }
  }
}

std::vector<Event> Registry::TakeEvents() {
  std::vector<Event> out;
  out.swap(pending_);
  return out;
}

}  // namespace connex::directory
