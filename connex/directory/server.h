// DirectoryServer: the embedded in-memory directory. It serves requests on a ZeroMQ ROUTER socket
// and publishes events and revision ticks on a PUB socket (docs/design/protocol.md).
// Thread-safe: Start returns a running server whose loop thread owns both sockets and the
// Registry; Stop may be called from any thread.
#ifndef CONNEX_DIRECTORY_SERVER_H_
#define CONNEX_DIRECTORY_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "connex/base/clock.h"
#include "connex/base/curve.h"
#include "connex/base/curve_zmq.h"
#include "connex/directory/protocol.h"
#include "zmq.hpp"

namespace connex::directory {

struct DirectoryServerOptions {
  std::string bind = "tcp://127.0.0.1:7000";  // requests (ROUTER); port 0 picks a free port
  std::string pub = "tcp://127.0.0.1:7001";   // events (PUB); port 0 picks a free port
  int64_t lease_ttl_ms = 3000;                // CONNEX_LEASE_TTL_MS
  int64_t heartbeat_ms = 1000;                // CONNEX_HEARTBEAT_MS: advised to clients
  std::string token;                          // CONNEX_DIRECTORY_TOKEN: empty = no auth
  // The operator's secret (forced JOINs, drains, reports from outside a model); empty = none.
  // CONNEX_DIRECTORY_ADMIN_TOKEN, or the first line of CONNEX_DIRECTORY_ADMIN_TOKEN_FILE.
  std::string admin_token;
  int64_t tick_ms = 250;  // CONNEX_DIRECTORY_TICK_MS: revision ticks on PUB
  // CONNEX_DIRECTORY_STATE_DIR: where the directory keeps its durable state (state_file.h), so
  // that epochs never repeat and a restart is invisible. Empty: in memory only.
  std::string state_dir;
  // Limits of the table (protocol.h): CONNEX_DIRECTORY_MAX_RECORDS,
  // CONNEX_DIRECTORY_MAX_RECORDS_PER_MODEL, CONNEX_DIRECTORY_MAX_RECORD_BYTES.
  size_t max_records = kDefaultMaxRecords;
  size_t max_records_per_model = kDefaultMaxRecordsPerModel;
  size_t max_record_bytes = kDefaultMaxRecordBytes;
  // CURVE (connex/base/curve.h): with a key pair, both sockets are CURVE servers that admit the
  // authorized client keys only, and may listen beyond loopback. CONNEX_CURVE_KEY_FILE,
  // CONNEX_CURVE_AUTHORIZED_KEYS_FILE.
  CurveSettings curve;
  Clock* clock = RealClock::Get();
  // Give the process's free heap back to the system (malloc_trim), checked once a second: when
  // more than 1 MB of its heap is free and its resident memory not in use by the heap grew by
  // 1 MB since the last trim. After a storm of connections, glibc keeps their buffers otherwise. A
  // process-wide act (it locks and walks every malloc arena), so off unless the process is a
  // directory alone: connex-directory turns it on, with fixed malloc thresholds
  // (apps/connex-directory/main.cc); a process that embeds servers among other work (tests, the
  // pp campaign's four, the Python module) leaves its heap to its owner.
  bool trim_heap = false;

  // Defaults overridden by CONNEX_DIRECTORY_BIND, CONNEX_DIRECTORY_PUB, CONNEX_LEASE_TTL_MS,
  // CONNEX_HEARTBEAT_MS, CONNEX_DIRECTORY_TOKEN, CONNEX_DIRECTORY_TICK_MS,
  // CONNEX_DIRECTORY_ADMIN_TOKEN(_FILE), CONNEX_DIRECTORY_STATE_DIR, the table limits and the
  // CURVE settings.
  static absl::StatusOr<DirectoryServerOptions> FromEnv();
};

class DirectoryServer {
 public:
  // Binds both sockets, loads the state dir (if any) and starts the loop. Unavailable when an
  // address is taken; InvalidArgument for a malformed endpoint or setting or an unwritable state
  // dir, or a non-loopback address without CURVE (unless CONNEX_INSECURE=1); FailedPrecondition
  // when another directory uses the state dir; DataLoss for a corrupt state file.
  static absl::StatusOr<std::unique_ptr<DirectoryServer>> Start(DirectoryServerOptions options);
  ~DirectoryServer();

  DirectoryServer(const DirectoryServer&) = delete;
  DirectoryServer& operator=(const DirectoryServer&) = delete;

  // The endpoints actually bound, with real ports: `tcp://127.0.0.1:40123`.
  const std::string& bind_address() const { return bind_address_; }
  const std::string& pub_address() const { return pub_address_; }
  uint64_t incarnation() const { return incarnation_; }

  // Stops the loop and closes the sockets. Idempotent.
  void Stop();

  // The next `n` events are assigned revisions but not published, as if a subscriber missed
  // them. For gap-recovery tests.
  void DropEventsForTest(int n) { drop_events_.fetch_add(n); }
  // The next `n` SNAPSHOT requests go unanswered, as if lost with a directory that died; how many
  // were. For tests of a watcher's recovery.
  void DropSnapshotsForTest(int n) { drop_snapshots_.fetch_add(n); }
  int snapshots_dropped_for_test() const { return snapshots_dropped_.load(); }

  // Requests served and malformed requests seen so far.
  uint64_t requests_served() const { return requests_served_.load(); }
  uint64_t requests_rejected() const { return requests_rejected_.load(); }
  // Requests dropped unread from connections past their budget of refusals (32 a second).
  uint64_t requests_dropped() const { return requests_dropped_.load(); }
  // SNAPSHOTs refused because their clients left too many replies unread (protocol.h).
  uint64_t snapshots_refused() const { return snapshots_refused_.load(); }
  // Connections refused by CURVE (a wrong or missing client key).
  uint64_t connections_refused() const { return zap_ ? zap_->refused() : 0; }
  // The longest one write of the state dir took so far (ms; 0 without a state dir). The loop
  // answers nobody while it writes, so a slow disk (fsync) delays every answer by as much.
  int64_t longest_state_write_ms() const { return longest_state_write_ms_.load(); }

 private:
  class Loop;
  explicit DirectoryServer(DirectoryServerOptions options);

  DirectoryServerOptions options_;
  std::string bind_address_;
  std::string pub_address_;
  uint64_t incarnation_ = 0;
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;  // with CURVE: decides which client keys get in
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> drop_events_{0};
  std::atomic<int> drop_snapshots_{0};
  std::atomic<int> snapshots_dropped_{0};
  std::atomic<uint64_t> requests_served_{0};
  std::atomic<uint64_t> requests_rejected_{0};
  std::atomic<uint64_t> requests_dropped_{0};
  std::atomic<uint64_t> snapshots_refused_{0};
  std::atomic<int64_t> longest_state_write_ms_{0};
};

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_SERVER_H_
