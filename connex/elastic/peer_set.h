// ElasticPeerSet: a sender's live view of one group of endpoints (say, every replica of pipeline
// stage 1) — the one place that knows which of the group's incarnations (LID, epoch) are live,
// draining (LEFT) or failed. It follows the directory's events and the transport's peer-death
// events (a dead process's connection closes in milliseconds, long before its lease expires),
// picks a peer for a request (sticky, then by replica preference, never by a fixed rank),
// evicts peers the sender saw fail without blocking the caller, and sends messages over
// persistent acknowledged channels.
//
// Thread-safe; no method blocks on the network except Start, WaitReady and Send. Change
// callbacks run one at a time, in the order of the changes, on the thread that caused the change
// (the DirectoryClient's loop, the transport's event thread, or the caller of MarkFailed); they
// must not block and must not call MarkFailed, OnChange or RemoveCallback (post to your own loop
// instead).
#ifndef CONNEX_ELASTIC_PEER_SET_H_
#define CONNEX_ELASTIC_PEER_SET_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/base/mutex.h"
#include "connex/directory/client.h"
#include "connex/elastic/channel.h"
#include "connex/elastic/group_view.h"
#include "connex/transport/transfer_engine.h"

namespace connex::elastic {

struct ElasticPeerSetOptions {
  std::string model;
  uint32_t group = 0;
  // The caller's own replica index: Pick prefers the peer of the same replica chain.
  uint32_t own_replica = 0;
  // How long Send waits for a peer's acknowledgement.
  int64_t send_timeout_ms = 1000;
  // Recorded in the directory's FAILED event when this sender reports a peer.
  std::string reporter = "elastic-peer-set";
  // Only this shard's records are members (the step protocol: 0); nullopt: every shard.
  std::optional<uint32_t> shard = std::nullopt;
  // Only records that publish an address starting with this are members (the step protocol:
  // "pp+"); empty: every record of the group.
  std::string member_address_prefix = "";
  // Draining and failed incarnations remembered at most, the oldest forgotten first (a newer
  // epoch of a LID supersedes them sooner).
  size_t max_remembered = 1024;
  // Reports to the directory queued at most; beyond, the oldest is dropped (and counted).
  size_t max_pending_reports = 1024;
  // Attempts per report when the directory does not answer, `report_retry_ms` apart.
  int report_attempts = 3;
  int64_t report_retry_ms = 100;
  // Attempts to watch (transport Connect) a new live peer, `watch_retry_ms` apart.
  int watch_attempts = 3;
  int64_t watch_retry_ms = 200;
  // Send's channels are CURVE clients with this key pair (MessageChannelsOptions::curve).
  CurveSettings curve = {};
};

struct ElasticPeerSetStats {
  uint64_t transport_evictions = 0;     // incarnations evicted on a transport kDead event
  uint64_t local_evictions = 0;         // by MarkFailed
  uint64_t stale_transport_events = 0;  // kDead/kSuspected that matched no live incarnation
  uint64_t suspicions = 0;
  uint64_t reports_sent = 0;     // accepted by the directory (evicted, or already gone)
  uint64_t reports_failed = 0;   // given up after report_attempts
  uint64_t reports_dropped = 0;  // the queue was full
  uint64_t watches = 0;          // transport Connect calls that succeeded
  uint64_t watch_errors = 0;
  uint64_t channels_opened = 0;  // persistent message channels opened by Send (one per peer)
  size_t open_channels = 0;
};

class ElasticPeerSet {
 public:
  // `client` and `transport` (may be null: no transport events, the directory alone) must
  // outlive the peer set. The peer set subscribes to `transport`'s peer events and connects to
  // (watches) each live peer through it. Call Start next.
  ElasticPeerSet(directory::DirectoryClient& client, transport::TransferEngine* transport,
                 ElasticPeerSetOptions options);
  // Without a transport (peers are evicted by the directory and by MarkFailed only).
  ElasticPeerSet(directory::DirectoryClient& client, ElasticPeerSetOptions options);
  // Constructs and starts a peer set.
  static absl::StatusOr<std::unique_ptr<ElasticPeerSet>> Create(
      directory::DirectoryClient& client, transport::TransferEngine* transport,
      ElasticPeerSetOptions options);
  // Stops callbacks, then the background threads; reports still queued are dropped and a report
  // in progress may hold the destructor up to the directory client's request timeout.
  ~ElasticPeerSet();

  ElasticPeerSet(const ElasticPeerSet&) = delete;
  ElasticPeerSet& operator=(const ElasticPeerSet&) = delete;

  // Watches the model and builds the view. Call once (FailedPrecondition the second time).
  // InvalidArgument: a bad model name; DeadlineExceeded/Unavailable: no directory answered.
  absl::Status Start();
  // Blocks until at least `n` peers are live; false after `timeout_ms`.
  bool WaitReady(size_t n, int64_t timeout_ms) const;

  // Live peers, sorted by LID.
  std::vector<directory::Record> Peers() const;
  std::vector<Lid> PeerLids() const;
  // Live, draining and (recently) failed incarnations with their state, sorted by (LID, epoch).
  std::vector<PeerInfo> Members() const;
  // The live incarnation of `lid`, if any.
  std::optional<directory::Record> Live(const Lid& lid) const;
  // Whether (lid, epoch) is live: may get new work. Draining, failed, superseded and unknown
  // incarnations are not usable.
  bool IsUsable(const Lid& lid, uint64_t epoch) const;
  PeerState StateOf(const Lid& lid, uint64_t epoch) const;

  // The sticky pick for a request: `current` (the peer its last step went to) if it is still
  // live, else the peer of the caller's own replica, else the first live replica after it
  // (wrapping around) — a stable choice that spreads the chains of a dead replica's senders.
  // Draining peers are never picked. Unavailable when no peer is live.
  absl::StatusOr<directory::Record> PickRecord(const Lid* current = nullptr) const;
  absl::StatusOr<Lid> Pick(const Lid* current = nullptr) const;

  // Sends `bytes` to live `lid` over its persistent channel and waits up to send_timeout_ms for
  // the acknowledgement. Unavailable: the peer is not live (draining, failed, unknown),
  // publishes no message address, did not acknowledge, or was evicted while the send waited
  // (then at once, with the eviction's reason).
  absl::Status Send(const Lid& lid, std::string_view bytes);

  // Evicts (lid, epoch) locally at once (epoch 0: the live incarnation of `lid`) and queues its
  // report to the directory, which evicts it for every sender; never blocks on the directory.
  // NotFound if that incarnation is neither live nor draining here.
  absl::Status MarkFailed(const Lid& lid, uint64_t epoch = 0);

  // Returns an id for RemoveCallback. After RemoveCallback returns, the callback is not running
  // and is never called again.
  uint64_t OnChange(std::function<void(const PeerChange&)> callback);
  void RemoveCallback(uint64_t id);

  ElasticPeerSetStats stats() const;
  // Reports queued or in progress.
  size_t pending_reports() const;

 private:
  struct Report {
    Lid lid;
    uint64_t epoch = 0;
  };
  struct Watch {
    transport::PeerRef peer;
    uint64_t epoch = 0;
  };

  void OnEvent(const directory::Event& event);
  void OnPeerEvent(const transport::PeerEvent& event);
  // Calls the callbacks. Every change is applied to the view and announced under one hold of
  // notify_mu_, so that callbacks see changes in the order they happened.
  void Announce(const PeerChange& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(notify_mu_);
  // What a change implies besides the callbacks: watch a new peer, close a gone one's channel.
  void Follow(const PeerChange& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueReport(const Lid& lid, uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchLoop();
  void ReportLoop();

  directory::DirectoryClient& client_;
  transport::TransferEngine* const transport_;
  const ElasticPeerSetOptions options_;
  uint64_t subscription_ = 0;
  uint64_t peer_subscription_ = 0;
  bool started_ = false;

  // Held while a change is applied and announced; taken before mu_.
  connex::Mutex notify_mu_;
  std::map<uint64_t, std::function<void(const PeerChange&)>> callbacks_ ABSL_GUARDED_BY(notify_mu_);
  uint64_t next_callback_ ABSL_GUARDED_BY(notify_mu_) = 1;

  mutable connex::Mutex mu_;
  GroupView view_ ABSL_GUARDED_BY(mu_);
  ElasticPeerSetStats stats_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Watch> watches_ ABSL_GUARDED_BY(mu_);  // to Connect
  std::deque<Report> reports_ ABSL_GUARDED_BY(mu_);
  bool reporting_ ABSL_GUARDED_BY(mu_) = false;  // a report is in progress
  // Created at the first Send (the step protocol has its own signals and never sends here).
  std::unique_ptr<MessageChannels> channels_ ABSL_GUARDED_BY(mu_);

  std::thread watcher_;
  std::thread reporter_;
};

}  // namespace connex::elastic

#endif  // CONNEX_ELASTIC_PEER_SET_H_
