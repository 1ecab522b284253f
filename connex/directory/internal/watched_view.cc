#include "connex/directory/internal/watched_view.h"

#include <algorithm>
#include <chrono>

#include "connex/base/check.h"

namespace connex::directory::internal {
namespace {

// Whether this thread is delivering events (Unsubscribe from a callback must not wait for it).
thread_local bool delivering = false;

}  // namespace

WatchedView::WatchedView(Clock* clock) : clock_(clock) {}

WatchedView::~WatchedView() { StopDelivery(); }

void WatchedView::StopDelivery() {
  {
    std::lock_guard<std::mutex> lock(delay_mu_);
    stop_ = true;  // what is still held back is never delivered
  }
  delay_cv_.notify_all();
  if (delay_thread_.joinable()) delay_thread_.join();
}

void WatchedView::OnEpochEnded(std::function<void(const Event&)> callback) {
  on_epoch_ended_ = std::move(callback);
}

void WatchedView::OnSnapshot(const std::string& scope, Snapshot snapshot) {
  std::vector<Event> synthesized;
  {
    MutexLock lock(&mu_);
    auto in_scope = [&scope](const Lid& lid) { return scope.empty() || lid.model == scope; };
    std::map<Lid, Record> fresh;
    for (Record& r : snapshot.records) {
      if (in_scope(r.lid)) fresh.emplace(r.lid, std::move(r));
    }
    const bool again = scopes_.count(scope) > 0;
    // A scope's first snapshot is the view's starting point, unless it replaces the per-model
    // scopes (a watch of every model): then, as after a gap, what differs is reported.
    if (again || (scope.empty() && !scopes_.empty())) {
      synthesized = EventsBetweenViews(view_, fresh, snapshot.revision, in_scope);
    }
    if (again) ++resnapshots_;
    for (auto it = view_.begin(); it != view_.end();) {
      it = in_scope(it->first) ? view_.erase(it) : std::next(it);
    }
    view_.merge(fresh);
    if (scope.empty()) scopes_.clear();
    scopes_.insert(scope);
  }
  Deliver(std::move(synthesized));
}

void WatchedView::OnEvent(const Event& event) {
  {
    MutexLock lock(&mu_);
    ApplyEventToView(event, &view_);
  }
  Deliver({event});
}

std::vector<Record> WatchedView::FilterView(std::string_view model,
                                            std::optional<uint32_t> group) const {
  std::vector<Record> out;
  for (const auto& [lid, record] : view_) {
    if (!model.empty() && lid.model != model) continue;
    if (group && lid.group != *group) continue;
    out.push_back(record);
  }
  return out;
}

std::vector<Record> WatchedView::View(std::string_view model, std::optional<uint32_t> group) const {
  MutexLock lock(&mu_);
  return FilterView(model, group);
}

bool WatchedView::AwaitView(std::string_view model,
                            const std::function<bool(const std::vector<Record>&)>& predicate,
                            int64_t timeout_ms) const {
  MutexLock lock(&mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return predicate(FilterView(model, std::nullopt));
  };
  // Woken by every change of the view; waited for in slices, so that the deadline follows the
  // injected clock.
  const int64_t deadline_ms = clock_->NowMs() + timeout_ms;
  while (true) {
    int64_t left = deadline_ms - clock_->NowMs();
    if (left <= 0) return holds();
    if (mu_.AwaitWithTimeout(absl::Condition(&holds),
                             absl::Milliseconds(std::min<int64_t>(left, 50)))) {
      return true;
    }
  }
}

uint64_t WatchedView::Subscribe(std::function<void(const Event&)> callback) {
  MutexLock lock(&mu_);
  uint64_t id = next_subscriber_++;
  subscribers_.emplace(id,
                       std::make_shared<std::function<void(const Event&)>>(std::move(callback)));
  return id;
}

void WatchedView::Unsubscribe(uint64_t id) {
  {
    MutexLock lock(&mu_);
    subscribers_.erase(id);
  }
  if (!delivering) std::lock_guard<std::mutex> wait(deliver_mu_);
}

uint64_t WatchedView::resnapshots() const {
  MutexLock lock(&mu_);
  return resnapshots_;
}

void WatchedView::DelayEventsForTest(int ms) {
  std::lock_guard<std::mutex> lock(delay_mu_);
  delay_ms_.store(ms);
  if (ms > 0 && !delay_thread_.joinable() && !stop_) {
    delay_thread_ = std::thread([this] { RunDelayed(); });
  }
}

void WatchedView::Deliver(std::vector<Event> events) {
  if (events.empty()) return;
  {
    std::lock_guard<std::mutex> lock(delay_mu_);
    if (stop_) return;  // StopDelivery: shutting down
    if (int delay = delay_ms_.load(); delay > 0 || !delayed_.empty()) {
      // Held back, in order, for the delay thread; the view and the leases carry on.
      CONNEX_CHECK(delay_thread_.joinable());
      delayed_.emplace_back(clock_->NowMs() + delay, std::move(events));
      delay_cv_.notify_all();
      return;
    }
  }
  DeliverNow(events);
}

void WatchedView::DeliverNow(const std::vector<Event>& events) {
  if (on_epoch_ended_) {
    for (const Event& e : events) {
      if (e.kind == EventKind::kFailed || e.kind == EventKind::kLeft) {
        on_epoch_ended_(e);
      }
    }
  }
  std::lock_guard<std::mutex> delivering_lock(deliver_mu_);
  delivering = true;
  for (const Event& e : events) {
    // Looked up per event: a callback unsubscribed by an earlier one is not called again.
    std::vector<std::shared_ptr<std::function<void(const Event&)>>> callbacks;
    {
      MutexLock lock(&mu_);
      for (const auto& [id, cb] : subscribers_) callbacks.push_back(cb);
    }
    for (auto& cb : callbacks) (*cb)(e);
  }
  delivering = false;
}

void WatchedView::RunDelayed() {
  std::unique_lock<std::mutex> lock(delay_mu_);
  while (!stop_) {
    if (delayed_.empty()) {
      delay_cv_.wait(lock, [this] { return stop_ || !delayed_.empty(); });
      continue;
    }
    const int64_t wait = delayed_.front().first - clock_->NowMs();
    if (wait > 0) {
      // In slices, so that the due time follows the injected clock.
      delay_cv_.wait_for(lock, std::chrono::milliseconds(std::min<int64_t>(wait, 20)));
      continue;
    }
    std::vector<Event> events = std::move(delayed_.front().second);
    lock.unlock();
    DeliverNow(events);  // before the next are taken: they stay in order
    lock.lock();
    delayed_.pop_front();
  }
}

}  // namespace connex::directory::internal
