#include "connex/elastic/peer_set.h"

#include <algorithm>

#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::elastic {
namespace {

GroupViewOptions ViewOptions(const ElasticPeerSetOptions& o) {
  GroupViewOptions v;
  v.model = o.model;
  v.group = o.group;
  v.shard = o.shard;
  v.own_replica = o.own_replica;
  v.member_address_prefix = o.member_address_prefix;
  v.max_remembered = o.max_remembered;
  return v;
}

// The data-plane addresses of a record: not the message channel's nor the step protocol's
// signal address.
transport::PeerRef TransportPeer(const directory::Record& r) {
  transport::PeerRef peer{r.lid, {}};
  for (const std::string& a : r.addresses) {
    if (a.rfind("zmq+", 0) != 0 && a.rfind("pp+", 0) != 0) peer.addresses.push_back(a);
  }
  return peer;
}

}  // namespace

ElasticPeerSet::ElasticPeerSet(directory::DirectoryClient& client,
                               transport::TransferEngine* transport, ElasticPeerSetOptions options)
    : client_(client),
      transport_(transport),
      options_(std::move(options)),
      view_(ViewOptions(options_)) {}

ElasticPeerSet::ElasticPeerSet(directory::DirectoryClient& client, ElasticPeerSetOptions options)
    : ElasticPeerSet(client, nullptr, std::move(options)) {}

absl::StatusOr<std::unique_ptr<ElasticPeerSet>> ElasticPeerSet::Create(
    directory::DirectoryClient& client, transport::TransferEngine* transport,
    ElasticPeerSetOptions options) {
  auto peers = std::make_unique<ElasticPeerSet>(client, transport, std::move(options));
  CONNEX_RETURN_IF_ERROR(peers->Start());
  return peers;
}

ElasticPeerSet::~ElasticPeerSet() {
  // No callback runs after these return.
  if (peer_subscription_ != 0) transport_->UnsubscribePeerEvents(peer_subscription_);
  if (subscription_ != 0) client_.Unsubscribe(subscription_);
  {
    connex::MutexLock lock(&mu_);
    stop_ = true;
    if (!reports_.empty()) {
      CONNEX_LOG_DEBUG("elastic {}/g{}: {} reports to the directory dropped at shutdown",
                       options_.model, options_.group, reports_.size());
    }
  }
  if (watcher_.joinable()) watcher_.join();
  if (reporter_.joinable()) reporter_.join();
}

absl::Status ElasticPeerSet::Start() {
  CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(options_.model));
  if (started_) {
    return absl::FailedPreconditionError(
        StrCat("elastic ", options_.model, "/g", options_.group, ": Start called twice"));
  }
  started_ = true;
  watcher_ = std::thread([this] { WatchLoop(); });
  reporter_ = std::thread([this] { ReportLoop(); });
  if (transport_ != nullptr) {
    peer_subscription_ =
        transport_->SubscribePeerEvents([this](const transport::PeerEvent& e) { OnPeerEvent(e); });
  }
  // Subscribe before reading the view: an event racing with the read is applied twice, which is
  // harmless, rather than not at all.
  subscription_ = client_.Subscribe([this](const directory::Event& e) { OnEvent(e); });
  CONNEX_RETURN_IF_ERROR(client_.Watch(options_.model));
  for (const directory::Record& r : client_.View(options_.model, options_.group)) {
    connex::MutexLock notify(&notify_mu_);
    std::optional<PeerChange> change;
    {
      connex::MutexLock lock(&mu_);
      change = view_.ApplyRecord(r);
      if (change) Follow(*change);
    }
    if (change) Announce(*change);
  }
  return absl::OkStatus();
}

void ElasticPeerSet::OnEvent(const directory::Event& event) {
  connex::MutexLock notify(&notify_mu_);
  std::optional<PeerChange> change;
  {
    connex::MutexLock lock(&mu_);
    change = view_.Apply(event);
    if (change) Follow(*change);
  }
  if (change) Announce(*change);
}

void ElasticPeerSet::OnPeerEvent(const transport::PeerEvent& event) {
  if (event.lid.model != options_.model || event.lid.group != options_.group) return;
  if (options_.shard && event.lid.shard != *options_.shard) return;
  connex::MutexLock notify(&notify_mu_);
  std::optional<PeerChange> change;
  {
    connex::MutexLock lock(&mu_);
    // Connections are keyed by LID; the address tells which incarnation the event is about, so
    // that a late event about a restarted endpoint's previous process does not condemn the new
    // one.
    std::optional<uint64_t> epoch = view_.EpochOfAddress(event.lid, event.address);
    if (!epoch) {
      if (event.kind != transport::PeerEventKind::kConnected) ++stats_.stale_transport_events;
      return;
    }
    switch (event.kind) {
      case transport::PeerEventKind::kConnected:
        view_.ClearSuspicion(event.lid, *epoch);
        break;
      case transport::PeerEventKind::kSuspected:
        // Only a suspicion (hung, stopped, partitioned; it may recover): recorded and announced,
        // never an eviction. The caller's step timeout and probe decide.
        change = view_.Suspect(event.lid, *epoch, StrCat("transport: ", event.detail));
        if (change) ++stats_.suspicions;
        break;
      case transport::PeerEventKind::kDead: {
        const bool was_live = view_.IsUsable(event.lid, *epoch);
        change = view_.Evict(event.lid, *epoch, StrCat("transport: ", event.detail));
        if (!change) break;
        ++stats_.transport_evictions;
        // Tell everyone: if the peer is in fact alive, it learns it was evicted and joins again
        // under a new epoch, rather than being avoided by this sender only. A draining peer has
        // left the directory already.
        if (was_live) QueueReport(event.lid, *epoch);
        break;
      }
    }
    if (change) Follow(*change);
  }
  if (change) Announce(*change);
}

void ElasticPeerSet::Announce(const PeerChange& change) {
  for (const auto& [id, cb] : callbacks_) cb(change);
}

void ElasticPeerSet::Follow(const PeerChange& change) {
  const directory::Record& r = change.record;
  switch (change.kind) {
    case PeerChange::Kind::kJoined:
    case PeerChange::Kind::kMigrated:
      if (transport_ != nullptr) {
        transport::PeerRef peer = TransportPeer(r);
        if (!peer.addresses.empty()) {
          if (watches_.size() >= std::max<size_t>(options_.max_pending_reports, 1)) {
            watches_.pop_front();
          }
          watches_.push_back(Watch{std::move(peer), r.epoch});
        }
      }
      if (change.previous_epoch != 0 && channels_ != nullptr) {
        channels_->CloseWhenIdle({r.lid, change.previous_epoch},
                                 StrCat("peer ", r.lid.ToString(), " epoch ", change.previous_epoch,
                                        " moved to epoch ", r.epoch));
      }
      break;
    case PeerChange::Kind::kLeft:
      if (channels_ != nullptr) {
        channels_->CloseWhenIdle({r.lid, r.epoch}, StrCat("peer ", r.lid.ToString(), " epoch ",
                                                          r.epoch, " is draining (LEFT)"));
      }
      break;
    case PeerChange::Kind::kFailed:
      if (channels_ != nullptr) {
        channels_->Close({r.lid, r.epoch}, StrCat("peer ", r.lid.ToString(), " epoch ", r.epoch,
                                                  " was evicted (", change.reason, ")"));
      }
      break;
    case PeerChange::Kind::kSuspected:
      break;
  }
}

bool ElasticPeerSet::WaitReady(size_t n, int64_t timeout_ms) const {
  connex::MutexLock lock(&mu_);
  auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return view_.live_count() >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(timeout_ms));
}

std::vector<directory::Record> ElasticPeerSet::Peers() const {
  connex::MutexLock lock(&mu_);
  return view_.LiveRecords();
}

std::vector<Lid> ElasticPeerSet::PeerLids() const {
  connex::MutexLock lock(&mu_);
  std::vector<Lid> out;
  for (const directory::Record& r : view_.LiveRecords()) out.push_back(r.lid);
  return out;
}

std::vector<PeerInfo> ElasticPeerSet::Members() const {
  connex::MutexLock lock(&mu_);
  return view_.Members();
}

std::optional<directory::Record> ElasticPeerSet::Live(const Lid& lid) const {
  connex::MutexLock lock(&mu_);
  const directory::Record* r = view_.Live(lid);
  if (r == nullptr) return std::nullopt;
  return *r;
}

bool ElasticPeerSet::IsUsable(const Lid& lid, uint64_t epoch) const {
  connex::MutexLock lock(&mu_);
  return view_.IsUsable(lid, epoch);
}

PeerState ElasticPeerSet::StateOf(const Lid& lid, uint64_t epoch) const {
  connex::MutexLock lock(&mu_);
  return view_.StateOf(lid, epoch);
}

absl::StatusOr<directory::Record> ElasticPeerSet::PickRecord(const Lid* current) const {
  connex::MutexLock lock(&mu_);
  const directory::Record* pick = view_.Pick(current);
  if (pick == nullptr) {
    return absl::UnavailableError(StrCat("no live peer in ", options_.model, "/g", options_.group));
  }
  return *pick;
}

absl::StatusOr<Lid> ElasticPeerSet::Pick(const Lid* current) const {
  CONNEX_ASSIGN_OR_RETURN(directory::Record r, PickRecord(current));
  return r.lid;
}

absl::Status ElasticPeerSet::Send(const Lid& lid, std::string_view bytes) {
  std::string address;
  uint64_t epoch = 0;
  MessageChannels* channels = nullptr;
  {
    connex::MutexLock lock(&mu_);
    const directory::Record* r = view_.Live(lid);
    if (r == nullptr) {
      std::string state = "not live";
      for (const PeerInfo& m : view_.Members()) {
        if (m.record.lid == lid) {
          state = StrCat(PeerStateName(m.state), m.reason.empty() ? "" : " (", m.reason,
                         m.reason.empty() ? "" : ")");
        }
      }
      return absl::UnavailableError(StrCat("peer ", lid.ToString(), " is ", state));
    }
    epoch = r->epoch;
    for (const std::string& a : r->addresses) {
      if (a.rfind(kMessageScheme, 0) == 0) address = a;
    }
    if (address.empty()) {
      return absl::UnavailableError(
          StrCat("peer ", lid.ToString(), " publishes no ", kMessageScheme, " address"));
    }
    if (channels_ == nullptr) {
      MessageChannelsOptions channel_options;
      channel_options.curve = options_.curve;
      CONNEX_ASSIGN_OR_RETURN(channels_, MessageChannels::Start(std::move(channel_options)));
    }
    channels = channels_.get();  // lives as long as the peer set
  }
  return Annotate(channels->Send({lid, epoch}, address, bytes, options_.send_timeout_ms),
                  StrCat("send to ", lid.ToString()));
}

absl::Status ElasticPeerSet::MarkFailed(const Lid& lid, uint64_t epoch) {
  connex::MutexLock notify(&notify_mu_);
  std::optional<PeerChange> change;
  {
    connex::MutexLock lock(&mu_);
    const directory::Record* live = view_.Live(lid);
    const bool was_live = live != nullptr && (epoch == 0 || live->epoch == epoch);
    change = view_.Evict(lid, epoch, StrCat("MarkFailed by ", options_.reporter));
    if (!change) {
      return absl::NotFoundError(StrCat("peer ", lid.ToString(),
                                        epoch == 0 ? "" : StrCat(" epoch ", epoch),
                                        " is not live here"));
    }
    ++stats_.local_evictions;
    if (was_live) QueueReport(lid, change->record.epoch);
    Follow(*change);
  }
  Announce(*change);
  return absl::OkStatus();
}

void ElasticPeerSet::QueueReport(const Lid& lid, uint64_t epoch) {
  for (const Report& r : reports_) {
    if (r.lid == lid && r.epoch == epoch) return;
  }
  if (reports_.size() >= std::max<size_t>(options_.max_pending_reports, 1)) {
    CONNEX_LOG_WARN("elastic {}/g{}: report queue full; dropping the report of {} epoch {}",
                    options_.model, options_.group, reports_.front().lid.ToString(),
                    reports_.front().epoch);
    reports_.pop_front();
    ++stats_.reports_dropped;
  }
  reports_.push_back(Report{lid, epoch});
}

void ElasticPeerSet::WatchLoop() {
  while (true) {
    Watch next;
    {
      connex::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !watches_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      next = std::move(watches_.front());
      watches_.pop_front();
    }
    // Connect may take up to the transport's connect timeout: never on a caller's thread. A
    // failed watch is retried while the incarnation is live (its death would go unseen), a few
    // times: a peer that cannot be reached at all is left to the caller's timeouts.
    const int attempts = std::max(options_.watch_attempts, 1);
    for (int attempt = 1; attempt <= attempts; ++attempt) {
      absl::Status watched = transport_->Connect(next.peer);
      connex::MutexLock lock(&mu_);
      if (watched.ok()) {
        ++stats_.watches;
        break;
      }
      ++stats_.watch_errors;
      CONNEX_LOG_DEBUG("elastic {}/g{}: cannot watch {} epoch {} (attempt {} of {}): {}",
                       options_.model, options_.group, next.peer.lid.ToString(), next.epoch,
                       attempt, attempts, AsStd(watched.message()));
      if (attempt == attempts || !view_.IsUsable(next.peer.lid, next.epoch)) break;
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping),
                               absl::Milliseconds(options_.watch_retry_ms))) {
        return;
      }
      if (!view_.IsUsable(next.peer.lid, next.epoch)) break;
    }
  }
}

void ElasticPeerSet::ReportLoop() {
  while (true) {
    Report next;
    {
      connex::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !reports_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      next = reports_.front();
      reports_.pop_front();
      reporting_ = true;
    }
    absl::Status last;
    bool done = false;
    for (int attempt = 1; attempt <= std::max(options_.report_attempts, 1) && !done; ++attempt) {
      absl::StatusOr<bool> r = client_.ReportFailed(next.lid, next.epoch, options_.reporter);
      // NotFound: that incarnation is gone already, which is what the report asked for.
      if (r.ok() || r.status().code() == absl::StatusCode::kNotFound) {
        done = true;
        break;
      }
      last = r.status();
      if (attempt == std::max(options_.report_attempts, 1)) break;
      connex::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping),
                               absl::Milliseconds(options_.report_retry_ms))) {
        reporting_ = false;
        return;
      }
    }
    connex::MutexLock lock(&mu_);
    reporting_ = false;
    if (done) {
      ++stats_.reports_sent;
    } else {
      ++stats_.reports_failed;
      CONNEX_LOG_WARN("elastic {}/g{}: report of {} epoch {} to the directory failed: {}",
                      options_.model, options_.group, next.lid.ToString(), next.epoch,
                      AsStd(last.message()));
    }
  }
}

uint64_t ElasticPeerSet::OnChange(std::function<void(const PeerChange&)> callback) {
  connex::MutexLock lock(&notify_mu_);
  uint64_t id = next_callback_++;
  callbacks_.emplace(id, std::move(callback));
  return id;
}

void ElasticPeerSet::RemoveCallback(uint64_t id) {
  connex::MutexLock lock(&notify_mu_);
  callbacks_.erase(id);
}

ElasticPeerSetStats ElasticPeerSet::stats() const {
  connex::MutexLock lock(&mu_);
  ElasticPeerSetStats stats = stats_;
  if (channels_ != nullptr) {
    stats.channels_opened = channels_->opened();
    stats.open_channels = channels_->open_channels();
  }
  return stats;
}

size_t ElasticPeerSet::pending_reports() const {
  connex::MutexLock lock(&mu_);
  return reports_.size() + (reporting_ ? 1 : 0);
}

}  // namespace connex::elastic
