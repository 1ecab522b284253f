// A peer process for multi-process tests and benchmarks: an engine of one backend with a
// managed buffer of known contents, announced on stdout. Used by `connex_transport_peer`
// (tests) and `connex-bench serve`.
#ifndef CONNEX_TRANSPORT_TESTING_PEER_SERVER_H_
#define CONNEX_TRANSPORT_TESTING_PEER_SERVER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "connex/transport/transfer_engine.h"

namespace connex::transport::testing {

// The byte at offset `i` of a peer's buffer.
inline uint8_t PatternByte(uint64_t seed, uint64_t i) {
  return static_cast<uint8_t>((i * 131) ^ (i >> 9) ^ (seed * 29));
}

// Creates the engine, allocates `size` bytes filled with PatternByte(seed, i), prints
//   READY <buffer address, hex> <size> <address> [<address>...]
// on stdout, then serves until stdin reaches EOF or reads "quit". "free" frees the buffer
// (waiting for reads in flight) and prints "FREED". Returns after a clean shutdown.
absl::Status RunPeerServer(const TransportOptions& options, size_t size, uint64_t seed);

}  // namespace connex::transport::testing

#endif  // CONNEX_TRANSPORT_TESTING_PEER_SERVER_H_
