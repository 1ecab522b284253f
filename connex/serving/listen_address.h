// ParseListenAddress: a `HOST:PORT` flag (--http, --listen) into the HTTP server's options.
#ifndef CONNEX_SERVING_LISTEN_ADDRESS_H_
#define CONNEX_SERVING_LISTEN_ADDRESS_H_

#include <string_view>

#include "absl/status/status.h"
#include "connex/serving/http_server.h"

namespace connex::serving {

// Sets options->host and options->port (0 .. 65535; 0 picks a free port) from `address`.
// InvalidArgument naming `flag` and the value when it is not HOST:PORT.
absl::Status ParseListenAddress(std::string_view flag, std::string_view address,
                                HttpServerOptions* options);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_LISTEN_ADDRESS_H_
