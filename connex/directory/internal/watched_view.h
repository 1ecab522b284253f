// WatchedView: a DirectoryClient's live view of the models it watches, fed by a store
// (store.h: WatchSink) and delivered to subscribers — written once for every backend. A scope's
// snapshot replaces its records; after the first, the differences are delivered as events (as
// after a gap), so a subscriber never misses a change. FAILED and LEFT events are shown to the
// lease keeper before any subscriber (an epoch of ours that ended is renewed at once).
//
// Thread-safe. Subscribers run on the thread that delivers (the store's, or the delay thread
// of DelayEventsForTest), one event at a time.
#ifndef CONNEX_DIRECTORY_INTERNAL_WATCHED_VIEW_H_
#define CONNEX_DIRECTORY_INTERNAL_WATCHED_VIEW_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "connex/base/clock.h"
#include "connex/base/mutex.h"
#include "connex/directory/internal/store.h"

namespace connex::directory::internal {

class WatchedView final : public WatchSink {
 public:
  explicit WatchedView(Clock* clock);
  ~WatchedView() override;  // stops the delay thread; events still held are dropped

  WatchedView(const WatchedView&) = delete;
  WatchedView& operator=(const WatchedView&) = delete;

  // Called with each FAILED / LEFT event before subscribers see it. Set before any watch starts.
  void OnEpochEnded(std::function<void(const Event& event)> callback);

  void OnSnapshot(const std::string& scope, Snapshot snapshot) override;
  void OnEvent(const Event& event) override;

  // The records of `model` ("" every model), and of `group` if given, sorted by LID.
  std::vector<Record> View(std::string_view model, std::optional<uint32_t> group) const;
  // Blocks until `predicate(View(model))` holds or `timeout_ms` of the clock passes.
  bool AwaitView(std::string_view model,
                 const std::function<bool(const std::vector<Record>&)>& predicate,
                 int64_t timeout_ms) const;
  uint64_t Subscribe(std::function<void(const Event&)> callback);
  // After it returns the callback is not running and never runs again (unless called from a
  // callback, whose own delivery is then in progress).
  void Unsubscribe(uint64_t id);
  // Fresh snapshots of a scope after its first.
  uint64_t resnapshots() const;
  // Holds every event `ms` before subscribers see it, in order; the view is not delayed.
  void DelayEventsForTest(int ms);
  // Delivers nothing more: events held back are dropped, and once it returns no callback runs
  // on the delay thread. For the owner's shutdown, once the store's threads (which deliver) are
  // gone and before what the callbacks reach (the lease keeper) goes.
  void StopDelivery();

 private:
  std::vector<Record> FilterView(std::string_view model, std::optional<uint32_t> group) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver(std::vector<Event> events);
  void DeliverNow(const std::vector<Event>& events);
  void RunDelayed();

  Clock* const clock_;
  std::function<void(const Event&)> on_epoch_ended_;

  mutable Mutex mu_;
  std::map<Lid, Record> view_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> scopes_ ABSL_GUARDED_BY(mu_);  // those with a snapshot
  uint64_t resnapshots_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::shared_ptr<std::function<void(const Event&)>>> subscribers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_subscriber_ ABSL_GUARDED_BY(mu_) = 1;

  std::mutex deliver_mu_;  // held while subscribers run, so that Unsubscribe can wait

  // DelayEventsForTest: events held (due ms, events) for the delay thread.
  std::atomic<int> delay_ms_{0};
  std::mutex delay_mu_;
  std::condition_variable delay_cv_;
  std::deque<std::pair<int64_t, std::vector<Event>>> delayed_;  // guarded by delay_mu_
  bool stop_ = false;                                           // guarded by delay_mu_
  std::thread delay_thread_;
};

}  // namespace connex::directory::internal

#endif  // CONNEX_DIRECTORY_INTERNAL_WATCHED_VIEW_H_
