// The `tcp` transport: one-sided reads emulated by the owner's server threads over TCP.
// Wire format, pipelining and failure detection: docs/design/transport.md. Thread-safe.
#ifndef CONNEX_TRANSPORT_TCP_TCP_ENGINE_H_
#define CONNEX_TRANSPORT_TCP_TCP_ENGINE_H_

#include "absl/status/statusor.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport::tcp {

// Listens on options.host (port chosen by the kernel) and publishes `tcp://host:port`.
absl::StatusOr<TransferEnginePtr> CreateTcpEngine(const TransportOptions& options);

}  // namespace connex::transport::tcp

#endif  // CONNEX_TRANSPORT_TCP_TCP_ENGINE_H_
