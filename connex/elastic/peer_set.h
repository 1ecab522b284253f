// ElasticPeerSet: a sender's live view of one group of endpoints (say, every replica of pipeline
// stage 1), kept current from the directory's events, with local eviction of peers the sender
// saw fail. Senders pick a peer by replica preference, never by a fixed rank.
//
// Thread-safe. Change callbacks run on the DirectoryClient's loop thread (directory events) or on
// the thread that called MarkFailed (local evictions); they must not block.
#ifndef CONNEX_ELASTIC_PEER_SET_H_
#define CONNEX_ELASTIC_PEER_SET_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/base/mutex.h"
#include "connex/directory/client.h"
#include "zmq.hpp"

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
};

struct PeerChange {
  enum class Kind { kJoined, kLeft, kFailed, kMigrated };
  Kind kind;
  directory::Record record;
  uint64_t previous_epoch = 0;  // kMigrated
  bool local = false;           // a local eviction by MarkFailed, not (yet) a directory event
};
std::string_view PeerChangeKindName(PeerChange::Kind kind);

class ElasticPeerSet {
 public:
  // `client` must outlive the peer set.
  ElasticPeerSet(directory::DirectoryClient& client, ElasticPeerSetOptions options);
  ~ElasticPeerSet();

  ElasticPeerSet(const ElasticPeerSet&) = delete;
  ElasticPeerSet& operator=(const ElasticPeerSet&) = delete;

  // Watches the model and builds the view. Call once.
  absl::Status Start();
  // Blocks until at least `n` peers are live; false after `timeout_ms`.
  bool WaitReady(size_t n, int64_t timeout_ms) const;
  // Live peers, sorted by LID.
  std::vector<directory::Record> Peers() const;
  std::vector<Lid> PeerLids() const;
  // The peer of the caller's own replica if it is live, else the first live replica after it
  // (wrapping around): a stable choice that spreads the chains of a dead replica's senders.
  // Unavailable when no peer is live.
  absl::StatusOr<Lid> Pick() const;
  // Sends `bytes` to `lid`'s message address and waits for the acknowledgement. Unavailable:
  // the peer is not live, publishes no message address, or did not acknowledge.
  absl::Status Send(const Lid& lid, std::string_view bytes);
  // Evicts `lid` locally at once and reports its epoch to the directory, which evicts it for
  // every sender. NotFound if `lid` is not live here.
  absl::Status MarkFailed(const Lid& lid);

  uint64_t OnChange(std::function<void(const PeerChange&)> callback);
  void RemoveCallback(uint64_t id);

 private:
  void OnEvent(const directory::Event& event);
  void Notify(const PeerChange& change);

  directory::DirectoryClient& client_;
  const ElasticPeerSetOptions options_;
  zmq::context_t context_;
  uint64_t subscription_ = 0;

  mutable connex::Mutex mu_;
  std::map<Lid, directory::Record> live_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<Lid, uint64_t>> evicted_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::function<void(const PeerChange&)>> callbacks_ ABSL_GUARDED_BY(mu_);
  uint64_t next_callback_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace connex::elastic

#endif  // CONNEX_ELASTIC_PEER_SET_H_
