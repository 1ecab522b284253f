#include "connex/elastic/peer_set.h"

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/elastic/channel.h"

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
  }
  return "UNKNOWN";
}

ElasticPeerSet::ElasticPeerSet(directory::DirectoryClient& client, ElasticPeerSetOptions options)
    : client_(client), options_(std::move(options)), context_(1) {}

ElasticPeerSet::~ElasticPeerSet() {
  if (subscription_ != 0) client_.Unsubscribe(subscription_);
}

absl::Status ElasticPeerSet::Start() {
  CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(options_.model));
  // Subscribe before reading the view: an event racing with the read is applied twice, which is
  // harmless, rather than not at all.
  subscription_ = client_.Subscribe([this](const directory::Event& e) { OnEvent(e); });
  CONNEX_RETURN_IF_ERROR(client_.Watch(options_.model));
  std::vector<directory::Record> records = client_.View(options_.model, options_.group);
  std::vector<PeerChange> changes;
  {
    connex::MutexLock lock(&mu_);
    for (directory::Record& r : records) {
      if (evicted_.count({r.lid, r.epoch})) continue;
      auto [it, inserted] = live_.insert_or_assign(r.lid, r);
      if (inserted) changes.push_back(PeerChange{PeerChange::Kind::kJoined, r, 0, false});
    }
  }
  for (const PeerChange& c : changes) Notify(c);
  return absl::OkStatus();
}

void ElasticPeerSet::OnEvent(const directory::Event& event) {
  const Lid& lid = event.record.lid;
  if (lid.model != options_.model || lid.group != options_.group) return;
  std::optional<PeerChange> change;
  {
    connex::MutexLock lock(&mu_);
    switch (event.kind) {
      case directory::EventKind::kJoined:
      case directory::EventKind::kMigrated: {
        if (evicted_.count({lid, event.record.epoch})) break;
        auto it = live_.find(lid);
        if (it != live_.end() && it->second.epoch == event.record.epoch) break;  // already known
        live_[lid] = event.record;
        change =
            PeerChange{event.kind == directory::EventKind::kJoined ? PeerChange::Kind::kJoined
                                                                   : PeerChange::Kind::kMigrated,
                       event.record, event.previous_epoch, false};
        break;
      }
      case directory::EventKind::kLeft:
      case directory::EventKind::kFailed: {
        auto it = live_.find(lid);
        if (it == live_.end() || it->second.epoch != event.record.epoch) break;
        live_.erase(it);
        change = PeerChange{event.kind == directory::EventKind::kLeft ? PeerChange::Kind::kLeft
                                                                      : PeerChange::Kind::kFailed,
                            event.record, 0, false};
        break;
      }
    }
  }
  if (change) Notify(*change);
}

void ElasticPeerSet::Notify(const PeerChange& change) {
  std::vector<std::function<void(const PeerChange&)>> callbacks;
  {
    connex::MutexLock lock(&mu_);
    for (const auto& [id, cb] : callbacks_) callbacks.push_back(cb);
  }
  for (auto& cb : callbacks) cb(change);
}

bool ElasticPeerSet::WaitReady(size_t n, int64_t timeout_ms) const {
  connex::MutexLock lock(&mu_);
  auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_.size() >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(timeout_ms));
}

std::vector<directory::Record> ElasticPeerSet::Peers() const {
  connex::MutexLock lock(&mu_);
  std::vector<directory::Record> out;
  for (const auto& [lid, r] : live_) out.push_back(r);
  return out;
}

std::vector<Lid> ElasticPeerSet::PeerLids() const {
  connex::MutexLock lock(&mu_);
  std::vector<Lid> out;
  for (const auto& [lid, r] : live_) out.push_back(lid);
  return out;
}

absl::StatusOr<Lid> ElasticPeerSet::Pick() const {
  connex::MutexLock lock(&mu_);
  if (live_.empty()) {
    return absl::UnavailableError(StrCat("no live peer in ", options_.model, "/g", options_.group));
  }
  const Lid* best = nullptr;
  const Lid* lowest = nullptr;
  for (const auto& [lid, r] : live_) {
    if (lowest == nullptr || lid.replica < lowest->replica) lowest = &lid;
    if (lid.replica >= options_.own_replica && (best == nullptr || lid.replica < best->replica)) {
      best = &lid;
    }
  }
  return best != nullptr ? *best : *lowest;
}

absl::Status ElasticPeerSet::Send(const Lid& lid, std::string_view bytes) {
  std::string address;
  {
    connex::MutexLock lock(&mu_);
    auto it = live_.find(lid);
    if (it == live_.end()) {
      return absl::UnavailableError(StrCat("peer ", lid.ToString(), " is not live"));
    }
    for (const std::string& a : it->second.addresses) {
      if (a.rfind(kMessageScheme, 0) == 0) address = a;
    }
  }
  if (address.empty()) {
    return absl::UnavailableError(
        StrCat("peer ", lid.ToString(), " publishes no ", kMessageScheme, " address"));
  }
  return Annotate(SendMessage(context_, address, bytes, options_.send_timeout_ms),
                  StrCat("send to ", lid.ToString()));
}

absl::Status ElasticPeerSet::MarkFailed(const Lid& lid) {
  directory::Record record;
  {
    connex::MutexLock lock(&mu_);
    auto it = live_.find(lid);
    if (it == live_.end()) {
      return absl::NotFoundError(StrCat("peer ", lid.ToString(), " is not live"));
    }
    record = it->second;
    live_.erase(it);
    evicted_.insert({lid, record.epoch});
  }
  Notify(PeerChange{PeerChange::Kind::kFailed, record, 0, true});
  absl::StatusOr<bool> reported = client_.ReportFailed(lid, record.epoch, options_.reporter);
  if (!reported.ok() && reported.status().code() != absl::StatusCode::kNotFound) {
    return Annotate(reported.status(), StrCat("report of ", lid.ToString()));
  }
  return absl::OkStatus();
}

uint64_t ElasticPeerSet::OnChange(std::function<void(const PeerChange&)> callback) {
  connex::MutexLock lock(&mu_);
  uint64_t id = next_callback_++;
  callbacks_.emplace(id, std::move(callback));
  return id;
}

void ElasticPeerSet::RemoveCallback(uint64_t id) {
  connex::MutexLock lock(&mu_);
  callbacks_.erase(id);
}

}  // namespace connex::elastic
