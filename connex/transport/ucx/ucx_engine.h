// The `ucx` transport: UCP RMA get (libucx 1.13) with packed rkeys fetched over a TCP side
// channel, endpoints with UCP_ERR_HANDLING_MODE_PEER, liveness over the side channel (EOF =
// dead, heartbeat = suspicion). Uses whatever UCX transports UCX_TLS allows (tcp, posix,
// sysv, cma here; RDMA on real clusters). Thread-safe.
#ifndef CONNEX_TRANSPORT_UCX_UCX_ENGINE_H_
#define CONNEX_TRANSPORT_UCX_UCX_ENGINE_H_

#include "absl/status/statusor.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport::ucx {

// Publishes `ucx://host:port` (the side channel). Unavailable when UCX cannot start.
absl::StatusOr<TransferEnginePtr> CreateUcxEngine(const TransportOptions& options);

}  // namespace connex::transport::ucx

#endif  // CONNEX_TRANSPORT_UCX_UCX_ENGINE_H_
