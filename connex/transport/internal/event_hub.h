// EventHub: the peer-event subscribers of one engine and the thread that calls them. Events are
// delivered in publication order on one dispatch thread, so callbacks may call back into the
// engine (even block) without stalling a progress thread. Thread-safe.
#ifndef CONNEX_TRANSPORT_INTERNAL_EVENT_HUB_H_
#define CONNEX_TRANSPORT_INTERNAL_EVENT_HUB_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "connex/base/mutex.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport::internal {

class EventHub {
 public:
  EventHub();
  // Drops undelivered events and joins the dispatch thread.
  ~EventHub();
  EventHub(const EventHub&) = delete;
  EventHub& operator=(const EventHub&) = delete;

  uint64_t Subscribe(PeerEventCallback cb);
  // After it returns the callback is not running and never runs again, except when called from
  // the callback itself.
  void Unsubscribe(uint64_t id);
  // Queues `event` for every subscriber.
  void Publish(PeerEvent event);
  // Waits until every event published so far has been delivered (tests, shutdown).
  void Flush();

 private:
  void Run();

  Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<PeerEventCallback>> subscribers_ ABSL_GUARDED_BY(mu_);
  std::deque<PeerEvent> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t published_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t running_id_ ABSL_GUARDED_BY(mu_) = 0;  // subscriber being called, 0 when none
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace connex::transport::internal

#endif  // CONNEX_TRANSPORT_INTERNAL_EVENT_HUB_H_
