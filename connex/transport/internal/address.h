// Transport addresses: `scheme://rest`, e.g. `tcp://127.0.0.1:4242`. Thread-safe (stateless).
#ifndef CONNEX_TRANSPORT_INTERNAL_ADDRESS_H_
#define CONNEX_TRANSPORT_INTERNAL_ADDRESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::transport::internal {

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

// The part after `scheme://` of the first address in `addresses` with that scheme.
std::optional<std::string> FindAddress(const std::vector<std::string>& addresses,
                                       std::string_view scheme);
// Parses `host:port`. InvalidArgument names the text.
absl::StatusOr<HostPort> ParseHostPort(std::string_view text);

// This host's name (gethostname; "localhost" if that fails), as shm:// addresses carry it.
std::string HostName();

// This host's identity, the same for every process of one boot of one machine (a hash of the
// hostname and the kernel's boot id); never 0.
uint64_t HostId();

}  // namespace connex::transport::internal

#endif  // CONNEX_TRANSPORT_INTERNAL_ADDRESS_H_
