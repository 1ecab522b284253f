// The `auto` transport: owns one engine per available backend and picks one per peer from the
// peer's published addresses — shm for a peer on this host, else ucx when it can reach the
// peer, else tcp (mem when a fabric is given and the peer is on it). Thread-safe.
#ifndef CONNEX_TRANSPORT_AUTO_ENGINE_H_
#define CONNEX_TRANSPORT_AUTO_ENGINE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport {

// `engines` in order of preference; the first one's managed buffers are used (and registered
// with the others). At least one engine.
absl::StatusOr<TransferEnginePtr> CreateAutoEngine(std::vector<TransferEnginePtr> engines);

}  // namespace connex::transport

#endif  // CONNEX_TRANSPORT_AUTO_ENGINE_H_
