#include "connex/transport/internal/address.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/numbers.h"
#include "connex/base/strings.h"

namespace connex::transport::internal {

std::optional<std::string> FindAddress(const std::vector<std::string>& addresses,
                                       std::string_view scheme) {
  std::string prefix = StrCat(scheme, "://");
  for (const std::string& a : addresses) {
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  }
  return std::nullopt;
}

absl::StatusOr<HostPort> ParseHostPort(std::string_view text) {
  size_t colon = text.rfind(':');
  uint32_t port = 0;
  if (colon == std::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(AsAbsl(text.substr(colon + 1)), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(StrCat("address '", text, "' is not host:port"));
  }
  return HostPort{std::string(text.substr(0, colon)), static_cast<uint16_t>(port)};
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

uint64_t HostId() {
  static const uint64_t id = [] {
    std::string boot;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (char c : StrCat(HostName(), "/", boot)) {
      h ^= static_cast<unsigned char>(c);
      h *= 1099511628211ull;
    }
    return h == 0 ? 1 : h;
  }();
  return id;
}

}  // namespace connex::transport::internal
