#include "connex/directory/etcd/model_watch.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::directory::etcd {

EtcdModelWatch::EtcdModelWatch(EtcdClient* client, std::string model,
                               std::function<void(const Event&)> on_event,
                               std::function<void(const Snapshot&)> on_snapshot)
    : client_(client),
      model_(std::move(model)),
      on_event_(std::move(on_event)),
      on_snapshot_(std::move(on_snapshot)) {}

absl::StatusOr<std::unique_ptr<EtcdModelWatch>> EtcdModelWatch::Start(
    EtcdClient* client, std::string model, std::function<void(const Event&)> on_event,
    std::function<void(const Snapshot&)> on_snapshot) {
  if (!model.empty()) CONNEX_RETURN_IF_ERROR(Lid::ValidateModel(model));
  std::unique_ptr<EtcdModelWatch> watch(
      new EtcdModelWatch(client, std::move(model), std::move(on_event), std::move(on_snapshot)));
  CONNEX_ASSIGN_OR_RETURN(Snapshot snapshot, watch->Read());
  watch->Install(std::move(snapshot), /*report=*/false);
  watch->thread_ = std::thread([w = watch.get()] { w->Run(); });
  return watch;
}

EtcdModelWatch::~EtcdModelWatch() {
  stop_.store(true);
  {
    MutexLock lock(&mu_);
    if (watch_) watch_->Cancel();
  }
  if (thread_.joinable()) thread_.join();
}

std::vector<Record> EtcdModelWatch::View() const {
  MutexLock lock(&mu_);
  std::vector<Record> records;
  records.reserve(view_.size());
  for (const auto& [lid, record] : view_) records.push_back(record);
  return records;
}

uint64_t EtcdModelWatch::revision() const {
  MutexLock lock(&mu_);
  return revision_;
}

uint64_t EtcdModelWatch::resnapshots() const {
  MutexLock lock(&mu_);
  return resnapshots_;
}

std::string EtcdModelWatch::member() const {
  MutexLock lock(&mu_);
  return watch_ ? watch_->member() : "";
}

void EtcdModelWatch::Resync() {
  MutexLock lock(&mu_);
  if (watch_) watch_->Cancel();
}

std::string EtcdModelWatch::prefix() const {
  return model_.empty() ? std::string(kRoot) : ModelPrefix(model_);
}

absl::StatusOr<Snapshot> EtcdModelWatch::Read() const {
  return model_.empty() ? ReadSnapshot(*client_) : ReadSnapshot(*client_, model_);
}

void EtcdModelWatch::Install(Snapshot snapshot, bool report) {
  // With on_snapshot, the snapshot itself is handed on (whoever takes it says what changed).
  if (on_snapshot_) on_snapshot_(snapshot);
  std::map<Lid, Record> fresh;
  for (Record& record : snapshot.records) fresh.emplace(record.lid, std::move(record));
  std::vector<Event> changes;
  WatchOptions options;
  options.range_end = PrefixEnd(prefix());
  options.start_revision = static_cast<int64_t>(snapshot.revision) + 1;
  options.prev_kv = true;
  std::shared_ptr<EtcdWatch> watch = client_->Watch(prefix(), options);
  {
    MutexLock lock(&mu_);
    if (report && !on_snapshot_) {
      changes =
          EventsBetweenViews(view_, fresh, snapshot.revision, [](const Lid&) { return true; });
    }
    if (report) ++resnapshots_;
    view_ = std::move(fresh);
    revision_ = snapshot.revision;
    if (watch_) watch_->Cancel();
    watch_ = std::move(watch);
    if (stop_.load()) watch_->Cancel();
  }
  deriver_ = std::make_unique<EventDeriver>(snapshot.revision);
  if (on_event_) {
    for (const Event& e : changes) on_event_(e);
  }
}

void EtcdModelWatch::Apply(const std::vector<Event>& events) {
  {
    MutexLock lock(&mu_);
    for (const Event& e : events) {
      revision_ = std::max(revision_, e.revision);
      ApplyEventToView(e, &view_);
    }
  }
  if (on_event_) {
    for (const Event& e : events) on_event_(e);
  }
}

void EtcdModelWatch::Run() {
  int failures = 0;
  while (!stop_.load()) {
    std::shared_ptr<EtcdWatch> watch;
    {
      MutexLock lock(&mu_);
      watch = watch_;
    }
    absl::StatusOr<WatchResponse> response = watch->Next(absl::Milliseconds(200));
    if (stop_.load()) return;
    if (absl::IsDeadlineExceeded(response.status())) continue;
    if (response.ok()) {
      failures = 0;
      std::vector<Event> events = deriver_->Apply(*response);
      // Progress: the view is up to date as of the response's revision.
      {
        MutexLock lock(&mu_);
        revision_ = std::max(revision_, deriver_->last_revision());
      }
      if (!events.empty()) Apply(events);
      continue;
    }
    // The watch is over: compacted past what it needs next, or cancelled by etcd. A fresh
    // snapshot says what changed meanwhile; then watch again from there.
    if (std::optional<int64_t> compacted = CompactRevisionOf(response.status())) {
      CONNEX_LOG_INFO(
          "etcd directory: the history of model '{}' was compacted at {} past the "
          "watch's revision {}: fresh snapshot",
          model_, *compacted, watch->next_revision());
    } else {
      CONNEX_LOG_WARN("etcd directory: the watch of model '{}' ended ({}): fresh snapshot", model_,
                      response.status().ToString());
    }
    absl::StatusOr<Snapshot> snapshot = Read();
    while (!snapshot.ok() && !stop_.load()) {
      // Backing off (50 ms doubling to 1 s) while etcd cannot answer.
      absl::SleepFor(
          absl::Milliseconds(std::min<int64_t>(1000, int64_t{50} << std::min(failures, 5))));
      ++failures;
      CONNEX_LOG_DEBUG("etcd directory: snapshot of model '{}' failed: {}", model_,
                       snapshot.status().ToString());
      snapshot = Read();
    }
    if (stop_.load()) return;
    Install(*std::move(snapshot), /*report=*/true);
  }
}

}  // namespace connex::directory::etcd
