// The data plane: a TransferEngine moves bytes between registered memory regions of two
// endpoints with one-sided reads, and reports peer liveness as events keyed by the peer's LID.
// Backends (mem, tcp, shm, ucx) live in sub-folders; CreateTransferEngine picks one. Every
// TransferEngine is thread-safe: all methods may be called from any thread.
#ifndef CONNEX_TRANSPORT_TRANSFER_ENGINE_H_
#define CONNEX_TRANSPORT_TRANSFER_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/lid.h"

namespace connex::transport {

enum class Backend { kAuto, kMem, kTcp, kShm, kUcx };

// "auto", "mem", "tcp", "shm", "ucx".
std::string_view BackendName(Backend backend);
// Parses "auto|mem|tcp|shm|ucx". InvalidArgument names the bad value and the choices.
absl::StatusOr<Backend> ParseBackend(std::string_view text);
// Parses the backends `auto` tries, in order: a comma-separated list of shm, ucx and tcp, each
// at most once ("shm,tcp"). InvalidArgument names what is wrong.
absl::StatusOr<std::vector<Backend>> ParseAutoBackends(std::string_view text);

// A peer as the directory publishes it: its LID and one address per transport it serves.
// Addresses are self-describing: `mem://...`, `tcp://host:port`, `shm://...`, `ucx://host:port`.
struct PeerRef {
  Lid lid;
  std::vector<std::string> addresses;
};

enum class PeerEventKind {
  kConnected,  // a connection to the peer is established (again)
  kDead,       // the peer's process is gone (closed socket, endpoint error, killed)
  kSuspected,  // the peer stopped answering heartbeats (hung, stopped, partitioned); may recover
};
std::string_view PeerEventKindName(PeerEventKind kind);

struct PeerEvent {
  PeerEventKind kind = PeerEventKind::kConnected;
  Lid lid;              // the peer the event is about
  std::string address;  // the address the connection used
  std::string detail;   // human-readable cause, e.g. "tcp: connection closed by peer"
};

using PeerEventCallback = std::function<void(const PeerEvent&)>;

// What a backend can do; queried, never guessed.
struct Capabilities {
  std::string backend;               // "mem", "tcp", "shm", "ucx" or "auto"
  bool peer_events = false;          // kConnected/kDead events are delivered
  bool hung_peer_detection = false;  // kSuspected events from a heartbeat
  bool same_host_only = false;       // peers must run on this host (shm)
  bool cross_process = false;        // peers may be other processes (false only for mem)
};

// A TransferEngine moves bytes between registered memory regions of two endpoints.
// Thread-safe: all methods may be called from any thread. Peer-event callbacks run on one
// internal dispatch thread, in order; they may call any method of the engine.
//
// Status codes: Unavailable — the peer is gone or unreachable (retry on another peer), always
// returned promptly, never a hang; InvalidArgument — a range is not registered, or bad input
// (the message names the range); FailedPrecondition — the address answers with another LID.
class TransferEngine {
 public:
  virtual ~TransferEngine() = default;

  // Registers [addr, addr+length) so that it may be read by peers and be the destination of
  // reads. InvalidArgument if it overlaps a registered range or is empty.
  virtual absl::Status RegisterMemory(void* addr, size_t length) = 0;
  // Unregisters the range that starts at `addr`. Blocks until reads in flight that use the range
  // (locally or served to peers) have finished; later reads of it fail with InvalidArgument.
  virtual absl::Status UnregisterMemory(void* addr) = 0;

  // Reads `length` bytes at `remote_addr` of `peer`'s registered memory into local registered
  // memory at `local`. Connects (or reconnects, when the LID's address changed) as needed.
  virtual absl::Status TransferSyncRead(const PeerRef& peer, void* local, uint64_t remote_addr,
                                        size_t length) = 0;

  // A registered buffer of `length` bytes owned by the engine (the fast path for backends that
  // need special memory, e.g. shared memory for shm). Freed by FreeManagedBuffer or with the
  // engine.
  virtual absl::StatusOr<void*> AllocateManagedBuffer(size_t length) = 0;
  virtual absl::Status FreeManagedBuffer(void* buffer) = 0;
  // memcpy into / out of a managed buffer; InvalidArgument if the managed side is not inside a
  // managed buffer.
  virtual absl::Status CopyToManagedBuffer(void* dst, const void* src, size_t length) = 0;
  virtual absl::Status CopyFromManagedBuffer(void* dst, const void* src, size_t length) = 0;

  // The addresses this endpoint publishes in the directory.
  virtual std::vector<std::string> LocalAddresses() const = 0;
  virtual Capabilities GetCapabilities() const = 0;

  // Establishes a connection to `peer` and watches its liveness without a read. Idempotent.
  // Unavailable when the peer cannot be reached.
  virtual absl::Status Connect(const PeerRef& peer) = 0;

  // Subscribes to events about every peer this engine has connected to. Returns an id for
  // UnsubscribePeerEvents; after that returns, `cb` is not running and is never called again
  // (unless Unsubscribe is called from within a callback, which is allowed).
  virtual uint64_t SubscribePeerEvents(PeerEventCallback cb) = 0;
  virtual void UnsubscribePeerEvents(uint64_t id) = 0;
};

using TransferEnginePtr = std::unique_ptr<TransferEngine>;

namespace mem {
class Fabric;
}  // namespace mem

enum class UcxPeerErrors { kAuto, kOn, kOff };
// "auto", or a boolean (1/0, true/false, yes/no, on/off). InvalidArgument names the text.
absl::StatusOr<UcxPeerErrors> ParseUcxPeerErrors(std::string_view text);

struct TransportOptions {
  Backend backend = Backend::kAuto;  // CONNEX_PP_BACKEND
  Lid local_lid;                     // this endpoint's identity, sent in every handshake
  std::string host = "127.0.0.1";    // interface the tcp/ucx listeners bind and publish
  int heartbeat_ms = 250;            // CONNEX_TRANSPORT_HEARTBEAT_MS
  int suspect_ms = 1000;             // CONNEX_TRANSPORT_SUSPECT_MS
  int connect_timeout_ms = 2000;     // CONNEX_TRANSPORT_CONNECT_TIMEOUT_MS
  int tcp_connections = 4;           // CONNEX_TRANSPORT_TCP_CONNECTIONS: data connections per peer
  // CONNEX_TRANSPORT_TCP_SOCKET_BUFFER: SO_SNDBUF/SO_RCVBUF of tcp data connections (bytes; the
  // kernel doubles it); 0 leaves the kernel's autotuning alone.
  int tcp_socket_buffer = 256 << 10;
  int spin_us = 50;                  // CONNEX_TRANSPORT_SPIN_US: busy-poll before blocking
  std::string shm_dir = "/dev/shm";  // CONNEX_TRANSPORT_SHM_DIR: where shm sockets live
  // CONNEX_TRANSPORT_UCX_PEER_ERRORS: whether UCX endpoints use UCP_ERR_HANDLING_MODE_PEER.
  // UCX 1.13 has no peer-failure support on its shared-memory transports and refuses them for
  // such endpoints; kAuto turns it off for a peer on this host (so UCX can use posix/sysv/cma)
  // and on for the others. Without it, peer death is reported by the side channel alone.
  UcxPeerErrors ucx_peer_errors = UcxPeerErrors::kAuto;
  // CONNEX_TRANSPORT_AUTO_BACKENDS: the backends kAuto starts and tries for a peer, in order
  // (shm reaches only peers on this host; the first that connects serves the peer).
  std::vector<Backend> auto_backends = {Backend::kShm, Backend::kUcx, Backend::kTcp};
  // mem only: the in-process fabric the engine attaches to (required for kMem; for kAuto, adds
  // mem to the candidates).
  std::shared_ptr<mem::Fabric> fabric;

  // Options for `local_lid` from CONNEX_PP_BACKEND, CONNEX_TRANSPORT_* (defaults above).
  // InvalidArgument names a bad variable.
  static absl::StatusOr<TransportOptions> FromEnv(const Lid& local_lid);
};

// Creates the engine that `options.backend` names. kAuto creates every backend available here
// and picks one per peer from its published addresses (shm for a same-host peer, else ucx,
// else tcp). Unavailable when a backend cannot start (e.g. UCX fails to initialise).
absl::StatusOr<TransferEnginePtr> CreateTransferEngine(const TransportOptions& options);

}  // namespace connex::transport

#endif  // CONNEX_TRANSPORT_TRANSFER_ENGINE_H_
