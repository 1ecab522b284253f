// DirectoryServer::Loop: the embedded directory's loop (server.h), owned by its thread with both
// sockets and the Registry. Its methods sit in rooms: the loop itself, the state file and the
// server's start in server.cc; decoding and dispatching a request in server_requests.cc; what is
// kept per connection — the budget of refused requests, unread reply bytes, snapshots served
// within bounds — in server_connections.cc; events and ticks on PUB in server_publish.cc.
// Confined to the loop thread (Persist also runs once in Start, before the thread exists).
#ifndef CONNEX_DIRECTORY_INTERNAL_SERVER_LOOP_H_
#define CONNEX_DIRECTORY_INTERNAL_SERVER_LOOP_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/codec.h"
#include "connex/directory/protocol.h"
#include "connex/directory/registry.h"
#include "connex/directory/server.h"
#include "connex/directory/state_file.h"
#include "zmq.hpp"

namespace connex::directory {

// "12 MiB", or "300 KiB" below 1 MiB (server_connections.cc): the directory's log lines.
std::string Mib(int64_t bytes);

// Bytes of replies handed to ZeroMQ and not yet sent (or dropped): libzmq frees a message's
// data once it has written it to the connection, or when the connection goes. Counted per
// connection and in total; the counters outlive the loop (libzmq may free a message after it).
struct Unread {
  std::atomic<int64_t> total{0};
};

class DirectoryServer::Loop {
 public:
  Loop(DirectoryServer* server, zmq::socket_t router, zmq::socket_t pub, uint64_t first_epoch,
       std::unique_ptr<StateFile> state, const std::optional<RegistryState>& saved);

  // Writes the state file when the table or the epoch counter changed since the last write.
  // Called before replies and events go out, so nothing anyone saw is ever lost or handed out
  // again by a restart.
  absl::Status Persist();

  static RegistryOptions MakeRegistryOptions(const DirectoryServerOptions& o, uint64_t first_epoch);

  void Run();

 private:
  // A connection whose requests were refused as malformed, invalid or unauthenticated more than
  // kJunkPerSecond times in a second is not read for kJunkCooldownMs: its requests are dropped
  // unanswered before they are parsed (a legitimate client never comes near the bound).
  static constexpr int kJunkPerSecond = 32;
  static constexpr int64_t kJunkCooldownMs = 1000;
  struct JunkBudget {
    int64_t window_ms = 0;  // the start of the second `refused` counts in
    int refused = 0;
    int64_t cooldown_until_ms = 0;
  };

  // ---- the connection's budget and replies: server_connections.cc ----

  void HandleMessage(std::vector<zmq::message_t>& parts);
  void SendReplies();
  // The counter of unsent reply bytes of the connection `envelope` names (its ROUTER identity).
  std::shared_ptr<std::atomic<int64_t>> UnreadOf(const std::vector<zmq::message_t>& envelope);
  // Sends one reply without copying it, counted as unread until libzmq is done with it.
  void Send(std::vector<zmq::message_t>& envelope, std::string frame);
  // Serves waiting SNAPSHOTs for at most kSnapshotBudgetMs, then returns to the loop (heartbeats
  // and other cheap requests are handled in between). A snapshot is encoded once per revision
  // and scope, and copied for each request of it.
  void ServeSnapshots();
  // The encoded snapshot of a scope at the current revision (records' lease_left_ms at most
  // kSnapshotCacheMs old).
  const wire::MapBuilder& EncodedSnapshot(const std::optional<std::string>& model,
                                          std::optional<uint32_t> group);

  // ---- requests: server_requests.cc ----

  struct PendingSnapshot {
    std::vector<zmq::message_t> envelope;
    uint64_t id = 0;
    std::optional<std::string> model;
    std::optional<uint32_t> group;
  };

  void HandleRequest(std::vector<zmq::message_t>& parts);
  absl::StatusOr<PendingSnapshot> ParseSnapshot(const wire::MapView& body);
  absl::Status CheckToken(const wire::MapView& body);
  static absl::StatusOr<Lid> LidField(const wire::MapView& body);
  absl::StatusOr<std::string> Dispatch(const wire::Frame& frame, uint64_t id);
  absl::StatusOr<std::string> HandleLidRequest(const std::string& type, const Lid& lid,
                                               const wire::MapView& body, uint64_t id);

  // ---- PUB: server_publish.cc ----

  // Gives the freed heap back to the system when due (server.cc).
  void MaybeTrimHeap(int64_t now);

  void Publish();
  // The directory-wide TICK, then one per model with a known latest event (a watcher of that
  // model alone finds a dropped event by it).
  void PublishTick();
  // A model somebody took a snapshot of is ticked for a while even without events: its new
  // watcher learns from the tick that its subscription is up. Bounded like the table.
  void Watched(const std::string& model);
  void SendTick(std::string_view topic, const std::string& frame);

  struct Reply {
    std::vector<zmq::message_t> envelope;
    std::string frame;
  };

  DirectoryServer* server_;
  const DirectoryServerOptions& options_;
  zmq::socket_t router_;
  zmq::socket_t pub_;
  Registry registry_;
  std::unique_ptr<StateFile> state_;  // null: in memory only
  bool saved_ = false;
  uint64_t saved_next_epoch_ = 0;
  uint64_t saved_revision_ = 0;
  // A state write that takes this long is logged (a warning: every answer waited for it).
  static constexpr int64_t kSlowStateWriteMs = 200;
  std::vector<Reply> replies_;             // answers of one batch, sent once its state is durable
  std::deque<PendingSnapshot> snapshots_;  // checked, waiting for ServeSnapshots
  static constexpr int64_t kSnapshotBudgetMs = 20;
  static constexpr int64_t kTrimCheckEveryMs = 1'000;
  static constexpr size_t kTrimFreeBytes = 1 << 20;
  static constexpr int64_t kTrimGrowthBytes = 1 << 20;
  static constexpr int64_t kTrimLogBytes = 4 << 20;  // a trim giving back more logs at info
  int64_t last_trim_check_ms_ = 0;
  // The lowest "resident but not in use" seen since the last trim (ResidentSlackBytes in
  // server.cc): the memory a trim could not give back, plus what is not heap.
  int64_t slack_after_trim_ = std::numeric_limits<int64_t>::max();
  static constexpr int64_t kSnapshotCacheMs = 100;
  static constexpr size_t kMaxCachedSnapshots = 64;
  std::map<std::pair<std::optional<std::string>, std::optional<uint32_t>>,
           std::unique_ptr<wire::MapBuilder>>
      cache_;
  uint64_t cache_revision_ = 0;
  int64_t cache_at_ms_ = 0;
  std::shared_ptr<Unread> unread_ = std::make_shared<Unread>();
  std::unordered_map<std::string, std::shared_ptr<std::atomic<int64_t>>> unread_by_connection_;
  size_t prune_unread_at_ = 1024;
  // Refusals per connection (HandleMessage); at most kMaxJunkConnections tracked.
  static constexpr size_t kMaxJunkConnections = 4096;
  std::unordered_map<std::string, JunkBudget> junk_by_connection_;
  bool token_refused_ = false;  // the request being handled was refused for its token
  static constexpr int64_t kWatchedForMs = 60'000;
  std::map<std::string, int64_t> watched_;  // model -> when it was last snapshotted
};

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_INTERNAL_SERVER_LOOP_H_
