#include "connex/elastic/group_view.h"

#include <algorithm>
#include <tuple>

#include "connex/base/strings.h"

namespace connex::elastic {

std::string_view PeerChangeKindName(PeerChange::Kind kind) {
  switch (kind) {
    case PeerChange::Kind::kJoined:
      return "JOINED";
    case PeerChange::Kind::kLeft:
      return "LEFT";
    case PeerChange::Kind::kFailed:
      return "FAILED";
    case PeerChange::Kind::kMigrated:
      return "MIGRATED";
    case PeerChange::Kind::kSuspected:
      return "SUSPECTED";
  }
  return "UNKNOWN";
}

std::string_view PeerStateName(PeerState state) {
  switch (state) {
    case PeerState::kLive:
      return "live";
    case PeerState::kDraining:
      return "draining";
    case PeerState::kFailed:
      return "failed";
    case PeerState::kUnknown:
      return "unknown";
  }
  return "unknown";
}

GroupView::GroupView(GroupViewOptions options) : options_(std::move(options)) {}

bool GroupView::IsMember(const directory::Record& record) const {
  if (record.lid.model != options_.model || record.lid.group != options_.group) return false;
  if (options_.shard && record.lid.shard != *options_.shard) return false;
  if (options_.member_address_prefix.empty()) return true;
  return std::any_of(record.addresses.begin(), record.addresses.end(), [this](const auto& a) {
    return a.rfind(options_.member_address_prefix, 0) == 0;
  });
}

std::optional<PeerChange> GroupView::ApplyRecord(const directory::Record& record) {
  directory::Event joined;
  joined.kind = directory::EventKind::kJoined;
  joined.record = record;
  return Apply(joined);
}

std::optional<PeerChange> GroupView::Apply(const directory::Event& event) {
  const directory::Record& r = event.record;
  const Lid& lid = r.lid;
  if (lid.model != options_.model || lid.group != options_.group) return std::nullopt;
  if (options_.shard && lid.shard != *options_.shard) return std::nullopt;
  auto live = live_.find(lid);
  switch (event.kind) {
    case directory::EventKind::kJoined:
    case directory::EventKind::kMigrated: {
      if (gone_.count({lid, r.epoch})) return std::nullopt;  // evicted here; the directory lags
      if (live != live_.end() && live->second.record.epoch >= r.epoch) {
        if (live->second.record.epoch == r.epoch) live->second.record = r;  // a refresh
        return std::nullopt;
      }
      ForgetOlder(lid, r.epoch);
      uint64_t previous = live != live_.end() ? live->second.record.epoch : event.previous_epoch;
      if (!IsMember(r)) {
        // Superseded by an incarnation that is not a member (it publishes no address of the
        // required kind): the old one is gone for this sender.
        if (live == live_.end()) return std::nullopt;
        PeerChange gone{PeerChange::Kind::kFailed, live->second.record, 0, false,
                        StrCat("directory: superseded by epoch ", r.epoch, ", which publishes no ",
                               options_.member_address_prefix, " address")};
        live_.erase(live);
        return gone;
      }
      live_[lid] = LiveEntry{r, false};
      const bool migrated = event.kind == directory::EventKind::kMigrated;
      return PeerChange{migrated ? PeerChange::Kind::kMigrated : PeerChange::Kind::kJoined, r,
                        previous, false, migrated ? "directory: MIGRATED" : "directory: JOINED"};
    }
    case directory::EventKind::kLeft: {
      if (live == live_.end() || live->second.record.epoch != r.epoch) return std::nullopt;
      directory::Record record = live->second.record;
      live_.erase(live);
      Remember(record, PeerState::kDraining, "directory: LEFT");
      return PeerChange{PeerChange::Kind::kLeft, record, 0, false, "directory: LEFT"};
    }
    case directory::EventKind::kFailed: {
      std::string reason =
          StrCat("directory: FAILED", event.reason.empty() ? "" : " ", event.reason);
      if (live != live_.end() && live->second.record.epoch == r.epoch) {
        directory::Record record = live->second.record;
        live_.erase(live);
        Remember(record, PeerState::kFailed, reason);
        return PeerChange{PeerChange::Kind::kFailed, record, 0, false, reason};
      }
      auto gone = gone_.find({lid, r.epoch});
      if (gone == gone_.end() || gone->second.state != PeerState::kDraining) {
        return std::nullopt;  // unknown, or failed here already (announced then)
      }
      gone->second.state = PeerState::kFailed;
      gone->second.reason = reason;
      return PeerChange{PeerChange::Kind::kFailed, gone->second.record, 0, false, reason};
    }
  }
  return std::nullopt;
}

std::optional<PeerChange> GroupView::Evict(const Lid& lid, uint64_t epoch, std::string reason) {
  auto live = live_.find(lid);
  if (live != live_.end() && (epoch == 0 || live->second.record.epoch == epoch)) {
    directory::Record record = live->second.record;
    live_.erase(live);
    Remember(record, PeerState::kFailed, reason);
    return PeerChange{PeerChange::Kind::kFailed, record, 0, true, std::move(reason)};
  }
  // A draining incarnation (epoch 0: the newest one of `lid`).
  PeerInfo* draining = nullptr;
  for (auto& [key, info] : gone_) {
    if (key.first != lid || info.state != PeerState::kDraining) continue;
    if (epoch != 0 ? key.second == epoch
                   : (draining == nullptr || key.second > draining->record.epoch)) {
      draining = &info;
    }
  }
  if (draining == nullptr) return std::nullopt;
  draining->state = PeerState::kFailed;
  draining->reason = reason;
  return PeerChange{PeerChange::Kind::kFailed, draining->record, 0, true, std::move(reason)};
}

std::optional<uint64_t> GroupView::EpochOfAddress(const Lid& lid, std::string_view address) const {
  std::optional<uint64_t> best;
  auto consider = [&](const directory::Record& r) {
    bool match = address.empty() ||
                 std::find(r.addresses.begin(), r.addresses.end(), address) != r.addresses.end();
    if (match && (!best || r.epoch > *best)) best = r.epoch;
  };
  auto live = live_.find(lid);
  if (live != live_.end()) consider(live->second.record);
  for (auto it = gone_.lower_bound({lid, 0}); it != gone_.end() && it->first.first == lid; ++it) {
    if (it->second.state == PeerState::kDraining) consider(it->second.record);
  }
  return best;
}

std::optional<PeerChange> GroupView::Suspect(const Lid& lid, uint64_t epoch, std::string reason) {
  auto live = live_.find(lid);
  if (live == live_.end() || live->second.record.epoch != epoch || live->second.suspected) {
    return std::nullopt;
  }
  live->second.suspected = true;
  return PeerChange{PeerChange::Kind::kSuspected, live->second.record, 0, true, std::move(reason)};
}

void GroupView::ClearSuspicion(const Lid& lid, uint64_t epoch) {
  auto live = live_.find(lid);
  if (live != live_.end() && live->second.record.epoch == epoch) live->second.suspected = false;
}

const directory::Record* GroupView::Pick(const Lid* current) const {
  if (current != nullptr) {
    auto it = live_.find(*current);
    if (it != live_.end()) return &it->second.record;
  }
  const directory::Record* best = nullptr;
  const directory::Record* lowest = nullptr;
  for (const auto& [lid, l] : live_) {
    if (lowest == nullptr || lid.replica < lowest->lid.replica) lowest = &l.record;
    if (lid.replica >= options_.own_replica &&
        (best == nullptr || lid.replica < best->lid.replica)) {
      best = &l.record;
    }
  }
  return best != nullptr ? best : lowest;
}

bool GroupView::IsUsable(const Lid& lid, uint64_t epoch) const {
  auto it = live_.find(lid);
  return it != live_.end() && it->second.record.epoch == epoch;
}

PeerState GroupView::StateOf(const Lid& lid, uint64_t epoch) const {
  if (IsUsable(lid, epoch)) return PeerState::kLive;
  auto gone = gone_.find({lid, epoch});
  return gone != gone_.end() ? gone->second.state : PeerState::kUnknown;
}

const directory::Record* GroupView::Live(const Lid& lid) const {
  auto it = live_.find(lid);
  return it != live_.end() ? &it->second.record : nullptr;
}

std::vector<directory::Record> GroupView::LiveRecords() const {
  std::vector<directory::Record> out;
  out.reserve(live_.size());
  for (const auto& [lid, l] : live_) out.push_back(l.record);
  return out;
}

std::vector<PeerInfo> GroupView::Members() const {
  std::vector<PeerInfo> out;
  for (const auto& [lid, l] : live_)
    out.push_back(PeerInfo{l.record, PeerState::kLive, l.suspected, ""});
  for (const auto& [key, info] : gone_) out.push_back(info);
  std::sort(out.begin(), out.end(), [](const PeerInfo& a, const PeerInfo& b) {
    return std::tie(a.record.lid, a.record.epoch) < std::tie(b.record.lid, b.record.epoch);
  });
  return out;
}

void GroupView::Remember(const directory::Record& record, PeerState state, std::string reason) {
  Key key{record.lid, record.epoch};
  auto [it, inserted] =
      gone_.insert_or_assign(key, PeerInfo{record, state, false, std::move(reason)});
  if (inserted) gone_order_.push_back(key);
  while (gone_.size() > std::max<size_t>(options_.max_remembered, 1)) {
    gone_.erase(gone_order_.front());
    gone_order_.pop_front();
  }
}

void GroupView::Forget(const Key& key) {
  if (gone_.erase(key) == 0) return;
  gone_order_.erase(std::find(gone_order_.begin(), gone_order_.end(), key));
}

void GroupView::ForgetOlder(const Lid& lid, uint64_t epoch) {
  std::vector<Key> older;
  for (auto it = gone_.lower_bound({lid, 0}); it != gone_.end() && it->first.first == lid; ++it) {
    if (it->first.second < epoch) older.push_back(it->first);
  }
  for (const Key& key : older) Forget(key);
}

}  // namespace connex::elastic
