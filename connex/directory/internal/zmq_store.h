// ZmqStore: the embedded directory's store (store.h) — the connex-directory at `tcp://HOST:PORT`,
// reached with ZeroMQ: requests on a DEALER socket, events on a SUB socket, both owned by one loop
// thread. It keeps what is particular to that protocol: the HELLO, request ids and deadlines, the
// per-LID HEARTBEAT (zmq_store.cc), and the per-scope bookkeeping that finds gaps in the
// published events — revisions, the directory's incarnation, ticks — and answers them with a
// fresh snapshot (zmq_watch.cc). The lease keeper, the view and delivery are the shared client's.
// Internal to connex/directory; reach it through DirectoryClient.
#ifndef CONNEX_DIRECTORY_INTERNAL_ZMQ_STORE_H_
#define CONNEX_DIRECTORY_INTERNAL_ZMQ_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "connex/base/clock.h"
#include "connex/base/codec.h"
#include "connex/base/mutex.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/client.h"
#include "connex/directory/internal/store.h"

namespace connex::directory::internal {

using ReplyCallback = std::function<void(absl::StatusOr<wire::Frame>)>;

class ZmqStore final : public DirectoryStore {
 public:
  ZmqStore(DirectoryClientOptions options, WatchSink* sink)
      : options_(std::move(options)),
        sink_(sink),
        clock_(options_.clock != nullptr ? options_.clock : RealClock::Get()),
        context_(1) {}

  ~ZmqStore() override;

  absl::Status Start();

  int64_t lease_ttl_ms() const override { return lease_ttl_ms_; }
  int64_t advised_heartbeat_ms() const override { return advised_heartbeat_ms_; }

  // ---- transactions ----

  absl::StatusOr<Registry::JoinResult> Join(const Lid& lid,
                                            const std::vector<std::string>& addresses,
                                            const std::map<std::string, std::string>& metadata,
                                            const JoinAuth& auth) override;

  absl::Status Leave(const Lid& lid, uint64_t epoch, const Caller& caller) override;

  absl::StatusOr<bool> ReportFailed(const Lid& lid, uint64_t epoch, const Caller& caller) override;

  absl::StatusOr<Snapshot> GetSnapshot(std::optional<std::string> model,
                                       std::optional<uint32_t> group) override;

  // ---- the lease: one HEARTBEAT per held LID, all in flight at once ----

  std::vector<absl::StatusOr<Renewal>> Renew(const std::vector<Held>& held,
                                             int64_t timeout_ms) override;

  // Each LID has its own lease, renewed by its HEARTBEAT.
  std::optional<int64_t> LeaseLeftMs(int64_t renewal_age_ms) const override;

  // ---- the watch ----
  absl::Status Watch(const std::string& model) override;
  uint64_t view_revision() const override;
  uint64_t events_received() const override { return events_received_.load(); }
  void DropEventsForTest(int n) override { drop_events_.fetch_add(n); }
  const std::string& pub_address() const override { return pub_address_; }

 private:
  struct Outgoing {
    uint64_t id;
    std::string frame;
    ReplyCallback done;
    std::string type;
    int64_t timeout_ms;
  };
  struct Pending {
    int64_t deadline_ms;
    ReplyCallback done;
    std::string type;
    int64_t timeout_ms = 0;
  };
  // What one Watch keeps: "" every model, else one model.
  struct Scope {
    bool want_snapshot = true;
    bool in_flight = false;  // its SNAPSHOT request is out
    bool have_snapshot = false;
    bool live = false;             // a message of its topic came: the subscription is up
    int failures = 0;              // snapshots refused or lost in a row
    int64_t retry_at_ms = 0;       // after a failure: no new request before (backoff)
    uint64_t incarnation = 0;      // of the directory its snapshot came from
    uint64_t request = 0;          // the snapshot request in flight (a later one abandons it)
    uint64_t requested_under = 0;  // the directory incarnation of the last tick when it was asked
    uint64_t revision = 0;         // "": the directory's revision; else the model's latest event
    std::vector<std::pair<Event, uint64_t>> buffered;  // (event, its incarnation), to apply
  };

  void Wake();
  // `timeout_ms` 0: the request timeout.
  void Send(std::string_view type, wire::MapBuilder& body, ReplyCallback done,
            int64_t timeout_ms = 0);
  // A blocking method must not run on the loop thread, which alone could answer it.
  absl::Status NotOnLoopThread() const {
    if (std::this_thread::get_id() != loop_thread_id_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "DirectoryClient: blocking call from a callback on the client's loop thread");
  }
  absl::StatusOr<wire::Frame> Call(std::string_view type, wire::MapBuilder& body);

  // The loop thread.
  void Run();
  void SendOutbox();
  void HandleReply(std::vector<zmq::message_t>& parts);
  void ExpirePending(int64_t now);
  void Resubscribe();
  void RequestSnapshot(const std::string& name);
  void InstallSnapshot(const std::string& name, Snapshot snapshot);
  void HandlePublished(std::vector<zmq::message_t>& parts);
  void HandleTick(const wire::MapView& body, uint64_t incarnation);
  void ApplyEvent(const std::string& name, Event event, uint64_t incarnation);

  const DirectoryClientOptions options_;
  WatchSink* const sink_;
  Clock* const clock_;  // options_.clock, or the real clock
  zmq::context_t context_;
  zmq::socket_t dealer_;  // loop thread (after Start)
  zmq::socket_t sub_;     // loop thread
  int wake_fd_ = -1;
  std::string pub_address_;
  int64_t lease_ttl_ms_ = 0;
  int64_t advised_heartbeat_ms_ = 1000;
  std::thread thread_;
  std::thread::id loop_thread_id_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> drop_events_{0};
  std::atomic<uint64_t> events_received_{0};

  std::map<uint64_t, Pending> pending_;  // loop thread only

  mutable Mutex mu_;
  std::deque<Outgoing> outbox_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Scope> scopes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> to_subscribe_ ABSL_GUARDED_BY(mu_);  // topics for the loop thread
  uint64_t tick_incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // the directory's, from its last tick
};

}  // namespace connex::directory::internal

#endif  // CONNEX_DIRECTORY_INTERNAL_ZMQ_STORE_H_
