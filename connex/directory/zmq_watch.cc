// The embedded directory's store: the watch (the class is internal/zmq_store.h). Each scope (""
// every model, else one model) is a SUB topic and a snapshot at revision R; events apply in order
// after R, and a gap — an event that does not follow, a tick ahead of R, another incarnation of the
// directory — is answered with a fresh snapshot (docs/design/protocol.md, "Keeping a view").
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "connex/base/logging.h"
#include "connex/base/strings.h"
#include "connex/directory/internal/zmq_store.h"

namespace connex::directory::internal {

absl::Status ZmqStore::Watch(const std::string& model) {
  std::string key;
  {
    MutexLock lock(&mu_);
    if (scopes_.count("") == 0 && scopes_.count(model) == 0) {
      if (scopes_.empty() && !model.empty()) to_subscribe_.push_back(std::string(kTickTopic));
      if (model.empty()) {
        // Every model: one scope replaces the per-model ones (the view reports what its first
        // snapshot changes).
        scopes_.clear();
        to_subscribe_.push_back("");
        scopes_.emplace("", Scope{});
      } else {
        to_subscribe_.push_back(EventTopic(model));
        scopes_.emplace(model, Scope{});
      }
    }
    key = scopes_.count("") ? "" : model;
  }
  Wake();
  MutexLock lock(&mu_);
  // Ready once the snapshot is in and the subscription is live (a tick or event of its topic
  // came): events published before the SUB connection is up are otherwise lost to a slow
  // joiner until the next tick shows the gap.
  auto ready = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stop_.load()) return true;
    auto it = scopes_.find(key);
    if (it == scopes_.end()) it = scopes_.find("");  // replaced by a watch of every model
    return it != scopes_.end() && it->second.have_snapshot && it->second.live;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready),
                            absl::Milliseconds(options_.request_timeout_ms * 2))) {
    return absl::DeadlineExceededError(
        StrCat("directory ", options_.directory, ": no snapshot of ",
               key.empty() ? std::string("every model") : StrCat("model '", key, "'"), " within ",
               options_.request_timeout_ms * 2, " ms"));
  }
  return absl::OkStatus();
}

void ZmqStore::Resubscribe() {
  std::vector<std::string> topics;
  {
    MutexLock lock(&mu_);
    topics.swap(to_subscribe_);
  }
  for (const std::string& topic : topics) {
    try {
      sub_.set(zmq::sockopt::subscribe, topic);
    } catch (const zmq::error_t& e) {
      CONNEX_LOG_WARN("directory client: subscribing to '{}' failed: {}", topic, e.what());
    }
  }
}

// A fresh snapshot of scope `name` ("" = every model).

void ZmqStore::RequestSnapshot(const std::string& name) {
  uint64_t request = 0;
  {
    MutexLock lock(&mu_);
    auto it = scopes_.find(name);
    if (it == scopes_.end() || it->second.in_flight) return;
    it->second.in_flight = true;
    it->second.want_snapshot = false;
    request = ++it->second.request;
    it->second.requested_under = tick_incarnation_;
  }
  wire::MapBuilder body;
  if (!name.empty()) body.Str("model", name);
  Send(kSnapshot, body, [this, name, request](absl::StatusOr<wire::Frame> reply) {
    {
      MutexLock lock(&mu_);
      auto it = scopes_.find(name);
      if (it == scopes_.end() || it->second.request != request) return;  // abandoned
    }
    absl::StatusOr<Snapshot> snapshot =
        reply.ok() ? DecodeSnapshot(reply->body) : absl::StatusOr<Snapshot>(reply.status());
    if (!snapshot.ok()) {
      if (reply.ok()) {
        CONNEX_LOG_WARN("directory client: bad snapshot: {}", snapshot.status().ToString());
      } else {
        CONNEX_LOG_DEBUG("directory client: snapshot failed: {}", reply.status().ToString());
      }
      MutexLock lock(&mu_);
      auto it = scopes_.find(name);
      if (it != scopes_.end()) {
        // Retried with backoff (50 ms doubling to 1 s): a directory that refuses snapshots
        // under load (too many unread replies) is not asked again at once.
        Scope& sc = it->second;
        sc.in_flight = false;
        sc.want_snapshot = true;
        sc.retry_at_ms =
            clock_->NowMs() + std::min<int64_t>(1000, int64_t{50} << std::min(sc.failures, 5));
        ++sc.failures;
      }
      return;
    }
    {
      MutexLock lock(&mu_);
      auto it = scopes_.find(name);
      if (it != scopes_.end()) it->second.failures = 0;
    }
    InstallSnapshot(name, *std::move(snapshot));
  });
  SendOutbox();
}

void ZmqStore::InstallSnapshot(const std::string& name, Snapshot snapshot) {
  std::vector<std::pair<Event, uint64_t>> buffered;
  const uint64_t incarnation = snapshot.incarnation;
  {
    MutexLock lock(&mu_);
    auto scope = scopes_.find(name);
    if (scope == scopes_.end()) return;  // replaced by a watch of every model
    Scope& sc = scope->second;
    sc.in_flight = false;
    sc.incarnation = incarnation;
    sc.revision = name.empty() ? snapshot.revision : snapshot.model_revision;
    buffered.swap(sc.buffered);
    // Another directory incarnation: the other scopes' views are of the previous one.
    for (auto& [other, o] : scopes_) {
      if (o.have_snapshot && o.incarnation != incarnation) o.want_snapshot = true;
    }
  }
  sink_->OnSnapshot(name, std::move(snapshot));
  {
    // Only now: Watch returns once the view holds the snapshot.
    MutexLock lock(&mu_);
    auto scope = scopes_.find(name);
    if (scope != scopes_.end()) scope->second.have_snapshot = true;
  }
  // Events that arrived while the snapshot was in flight.
  std::sort(buffered.begin(), buffered.end(),
            [](const auto& a, const auto& b) { return a.first.revision < b.first.revision; });
  for (auto& [e, event_incarnation] : buffered) {
    if (event_incarnation == incarnation) ApplyEvent(name, std::move(e), event_incarnation);
  }
}

void ZmqStore::HandlePublished(std::vector<zmq::message_t>& parts) {
  if (parts.size() != 2) return;
  absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(AsView(parts[1]));
  if (!frame.ok()) {
    CONNEX_LOG_WARN("directory client: undecodable event: {}", frame.status().ToString());
    return;
  }
  absl::StatusOr<uint64_t> incarnation = frame->body.Uint("incarnation");
  if (!incarnation.ok()) return;
  if (frame->type == kTick) {
    HandleTick(frame->body, *incarnation);
    return;
  }
  if (frame->type != kEvent) return;
  events_received_.fetch_add(1);
  if (drop_events_.load() > 0) {
    drop_events_.fetch_sub(1);
    return;
  }
  absl::StatusOr<Event> event = DecodeEvent(frame->body);
  if (!event.ok()) {
    CONNEX_LOG_WARN("directory client: bad event: {}", event.status().ToString());
    return;
  }
  std::string name;
  {
    MutexLock lock(&mu_);
    name = scopes_.count("") ? "" : event->record.lid.model;
    auto it = scopes_.find(name);
    if (it == scopes_.end()) return;  // not a model this client watches
    Scope& sc = it->second;
    sc.live = true;
    if (!sc.have_snapshot || sc.in_flight) {
      sc.buffered.emplace_back(*std::move(event), *incarnation);
      return;
    }
  }
  ApplyEvent(name, *std::move(event), *incarnation);
}

// The directory-wide tick (`model` absent) shows a gap of the every-model scope and a restart
// of the directory (a new incarnation) to every scope; a model's tick shows a gap of that
// model's scope. Either makes the scope live (its subscription is up).

void ZmqStore::HandleTick(const wire::MapView& body, uint64_t incarnation) {
  absl::StatusOr<uint64_t> revision = body.Uint("revision");
  absl::StatusOr<std::string> model = body.StrOr("model", "");
  absl::StatusOr<uint64_t> model_revision = body.UintOr("model_revision", 0);
  if (!revision.ok() || !model.ok() || !model_revision.ok()) return;
  std::vector<std::string> stale;
  {
    MutexLock lock(&mu_);
    tick_incarnation_ = incarnation;
    for (auto& [name, sc] : scopes_) {
      // A snapshot asked of an earlier incarnation of the directory may never be answered (the
      // request died with it): abandoned for one asked of this one, at once rather than after
      // the request timeout, during which the watcher would be blind (campaign seed 33).
      if (sc.in_flight && sc.requested_under != 0 && sc.requested_under != incarnation) {
        CONNEX_LOG_DEBUG(
            "directory client: the directory restarted while the snapshot of '{}' "
            "was asked; asking again",
            name);
        sc.in_flight = false;
        ++sc.request;
        stale.push_back(name);
        continue;
      }
      uint64_t seen = 0;
      if (model->empty()) {
        if (name.empty()) sc.live = true;
        seen = name.empty() ? *revision : 0;
      } else {
        if (name != *model) continue;
        sc.live = true;
        seen = *model_revision;
      }
      if (!sc.have_snapshot || sc.in_flight) continue;
      if (incarnation != sc.incarnation || seen > sc.revision) {
        CONNEX_LOG_DEBUG("directory client: gap of '{}' (at {}, directory at {}); new snapshot",
                         name, sc.revision, seen);
        stale.push_back(name);
      }
    }
  }
  for (const std::string& name : stale) RequestSnapshot(name);
}

void ZmqStore::ApplyEvent(const std::string& name, Event event, uint64_t incarnation) {
  {
    MutexLock lock(&mu_);
    auto scope = scopes_.find(name);
    if (scope == scopes_.end()) return;
    Scope& sc = scope->second;
    if (event.revision <= sc.revision && incarnation == sc.incarnation) return;  // seen
    // Events of every model are numbered without gaps; a model's event names the revision of
    // the model's previous one.
    bool follows =
        name.empty() ? event.revision == sc.revision + 1 : event.model_previous <= sc.revision;
    if (incarnation != sc.incarnation || !follows) {
      sc.buffered.emplace_back(std::move(event), incarnation);
      sc.want_snapshot = true;
      return;
    }
    sc.revision = event.revision;
  }
  sink_->OnEvent(event);
}

uint64_t ZmqStore::view_revision() const {
  MutexLock lock(&mu_);
  uint64_t revision = 0;
  for (const auto& [name, scope] : scopes_) revision = std::max(revision, scope.revision);
  return revision;
}

}  // namespace connex::directory::internal
