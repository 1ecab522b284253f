// connex_transport_peer BACKEND LID SIZE SEED: a peer process for the transport conformance
// tests (see peer_server.h).
#include <cstdlib>
#include <iostream>

#include "connex/transport/testing/peer_server.h"

int main(int argc, char** argv) {
  using namespace connex::transport;
  if (argc != 5) {
    std::cerr << "usage: connex_transport_peer BACKEND LID SIZE SEED\n";
    return 2;
  }
  auto backend = ParseBackend(argv[1]);
  auto lid = connex::Lid::Parse(argv[2]);
  if (!backend.ok() || !lid.ok()) {
    std::cerr << "connex_transport_peer: bad backend or LID\n";
    return 2;
  }
  auto options = TransportOptions::FromEnv(*lid);
  if (!options.ok()) {
    std::cerr << options.status() << "\n";
    return 2;
  }
  options->backend = *backend;
  absl::Status s = testing::RunPeerServer(*options, std::strtoull(argv[3], nullptr, 10),
                                          std::strtoull(argv[4], nullptr, 10));
  if (!s.ok()) {
    std::cerr << "connex_transport_peer: " << s << "\n";
    return 1;
  }
  return 0;
}
