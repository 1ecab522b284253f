#include "connex/transport/testing/peer_server.h"

#include <cstdio>
#include <iostream>
#include <string>

#include "connex/base/status.h"
#include "fmt/format.h"

namespace connex::transport::testing {

absl::Status RunPeerServer(const TransportOptions& options, size_t size, uint64_t seed) {
  CONNEX_ASSIGN_OR_RETURN(TransferEnginePtr engine, CreateTransferEngine(options));
  CONNEX_ASSIGN_OR_RETURN(void* buffer, engine->AllocateManagedBuffer(size));
  auto* bytes = static_cast<uint8_t*>(buffer);
  for (size_t i = 0; i < size; ++i) bytes[i] = PatternByte(seed, i);
  std::string line = fmt::format("READY {:#x} {}", reinterpret_cast<uint64_t>(buffer), size);
  for (const std::string& a : engine->LocalAddresses()) line += " " + a;
  std::cout << line << std::endl;
  std::string command;
  while (std::getline(std::cin, command)) {
    if (command == "quit") break;
    if (command == "free" && buffer != nullptr) {
      CONNEX_RETURN_IF_ERROR(engine->FreeManagedBuffer(buffer));
      buffer = nullptr;
      std::cout << "FREED" << std::endl;
    }
  }
  return absl::OkStatus();
}

}  // namespace connex::transport::testing
