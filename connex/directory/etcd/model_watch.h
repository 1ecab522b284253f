// EtcdModelWatch: a watcher's live view of one model kept in etcd (docs/design/etcd.md) — a
// snapshot at revision R, then the model's etcd watch from R + 1 turned into directory events by
// EventDeriver. When the history it needs next was compacted (OutOfRange), or the watch ends for
// another reason, it takes a fresh snapshot and reports what changed meanwhile as the events the
// embedded directory's client synthesises after a gap (EventsBetweenViews), then watches again:
// no change is ever silently missed.
//
// Thread-safe. Events are delivered in revision order on the watch's own thread; the callback
// must not block for long nor destroy the watch.
#ifndef CONNEX_DIRECTORY_ETCD_MODEL_WATCH_H_
#define CONNEX_DIRECTORY_ETCD_MODEL_WATCH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/mutex.h"
#include "connex/directory/etcd/etcd_client.h"
#include "connex/directory/etcd/etcd_store.h"
#include "connex/directory/protocol.h"

namespace connex::directory::etcd {

class EtcdModelWatch {
 public:
  // Takes the model's first snapshot (its error, if it fails) and starts watching after it.
  // `model` "" watches every model. `client` must outlive the watch. With `on_snapshot`, every
  // snapshot installed (the first, before Start returns, and each fresh one) is handed to it,
  // in order with the events, instead of the events that say what a fresh one changed.
  static absl::StatusOr<std::unique_ptr<EtcdModelWatch>> Start(
      EtcdClient* client, std::string model, std::function<void(const Event&)> on_event,
      std::function<void(const Snapshot&)> on_snapshot = nullptr);
  ~EtcdModelWatch();  // stops the thread; no callback runs after it returns

  EtcdModelWatch(const EtcdModelWatch&) = delete;
  EtcdModelWatch& operator=(const EtcdModelWatch&) = delete;

  // The model's records as of revision(), sorted by LID.
  std::vector<Record> View() const;
  uint64_t revision() const;
  // Fresh snapshots taken after the first (a compaction, a watch that ended).
  uint64_t resnapshots() const;
  // The etcd member the watch streams from now (host:port), or empty between members.
  std::string member() const;
  // Ends the current etcd watch, as a lost stream would: the watch takes a fresh snapshot.
  void Resync();

 private:
  EtcdModelWatch(EtcdClient* client, std::string model, std::function<void(const Event&)> on_event,
                 std::function<void(const Snapshot&)> on_snapshot);
  // Installs `snapshot` as the view (reporting the differences when `report`), and starts the
  // watch from its revision + 1.
  void Install(Snapshot snapshot, bool report);
  std::string prefix() const;  // the keys watched
  absl::StatusOr<Snapshot> Read() const;
  void Run();
  void Apply(const std::vector<Event>& events);

  EtcdClient* client_;
  const std::string model_;
  std::function<void(const Event&)> on_event_;
  std::function<void(const Snapshot&)> on_snapshot_;
  std::atomic<bool> stop_{false};
  mutable Mutex mu_;
  std::map<Lid, Record> view_ ABSL_GUARDED_BY(mu_);
  uint64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resnapshots_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<EtcdWatch> watch_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<EventDeriver> deriver_;  // the watch thread's (and Start's, before it runs)
  std::thread thread_;
};

}  // namespace connex::directory::etcd

#endif  // CONNEX_DIRECTORY_ETCD_MODEL_WATCH_H_
