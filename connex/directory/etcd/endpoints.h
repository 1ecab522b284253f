// Parsing of an etcd directory address, `etcd://H1:P1,H2:P2,...`, into the cluster's members.
// Thread-safe (stateless).
#ifndef CONNEX_DIRECTORY_ETCD_ENDPOINTS_H_
#define CONNEX_DIRECTORY_ETCD_ENDPOINTS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::directory::etcd {

// One member's client endpoint.
struct EtcdEndpoint {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without its brackets
  uint16_t port = 0;

  // `host:port`, with brackets around an IPv6 host: what gRPC dials and what errors name.
  std::string ToString() const;
  bool operator==(const EtcdEndpoint&) const = default;
};

inline constexpr std::string_view kEtcdScheme = "etcd://";

// Whether `address` names an etcd cluster (starts with etcd://), as opposed to the embedded
// directory's tcp:// address.
bool IsEtcdAddress(std::string_view address);

// The members of `etcd://H1:P1,H2:P2,...`: at least one, each `host:port` (`[v6]:port` for an
// IPv6 address), port 1-65535, no duplicates, nothing after the list (no path, no query).
// InvalidArgument names the address and what is wrong with it.
absl::StatusOr<std::vector<EtcdEndpoint>> ParseEtcdAddress(std::string_view address);

}  // namespace connex::directory::etcd

#endif  // CONNEX_DIRECTORY_ETCD_ENDPOINTS_H_
