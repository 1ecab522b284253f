// The `shm` transport (same host): managed buffers live in memfd shared-memory segments that
// readers map (the fd is passed over a unix-domain socket), so a read is one memcpy; liveness
// over the unix-domain socket (EOF = dead, heartbeat = suspicion). Design and limits:
// docs/design/transport.md. Thread-safe.
#ifndef CONNEX_TRANSPORT_SHM_SHM_ENGINE_H_
#define CONNEX_TRANSPORT_SHM_SHM_ENGINE_H_

#include <string>

#include "absl/status/statusor.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport::shm {

// Listens on `<options.shm_dir>/connex-<pid>-<n>.sock` and publishes
// `shm://<hostname><socket path>`. Removes stale sockets of dead processes first.
absl::StatusOr<TransferEnginePtr> CreateShmEngine(const TransportOptions& options);

// Unlinks `connex-<pid>-*.sock` files in `dir` whose process is gone; returns how many.
int ReapStaleSockets(const std::string& dir);

}  // namespace connex::transport::shm

#endif  // CONNEX_TRANSPORT_SHM_SHM_ENGINE_H_
