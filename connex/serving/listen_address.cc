#include "connex/serving/listen_address.h"

#include <cstdint>
#include <string>

#include "connex/base/strings.h"

namespace connex::serving {

absl::Status ParseListenAddress(std::string_view flag, std::string_view address,
                                HttpServerOptions* options) {
  const size_t colon = address.rfind(':');
  auto bad = [&] {
    return absl::InvalidArgumentError(
        StrCat(flag, " ", address, ": expected HOST:PORT with a port in 0 .. 65535"));
  };
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) return bad();
  uint32_t port = 0;
  for (char c : address.substr(colon + 1)) {
    if (c < '0' || c > '9') return bad();
    port = port * 10 + static_cast<uint32_t>(c - '0');
    if (port > 65535) return bad();
  }
  options->host = std::string(address.substr(0, colon));
  options->port = static_cast<uint16_t>(port);
  return absl::OkStatus();
}

}  // namespace connex::serving
