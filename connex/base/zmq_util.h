// ZeroMQ helpers shared by the control plane and the message channels: endpoint parsing, binding
// with port 0, and a wake-up pipe for loops that own sockets. cppzmq throws zmq::error_t; these
// helpers turn errors into absl::Status. Functions are thread-safe; sockets passed in must be
// owned by the calling thread.
#ifndef CONNEX_BASE_ZMQ_UTIL_H_
#define CONNEX_BASE_ZMQ_UTIL_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "zmq.hpp"

namespace connex {

// A tcp endpoint `tcp://HOST:PORT`.
struct TcpEndpoint {
  std::string host;
  int port = 0;
  std::string ToString() const;
};

// Parses `tcp://HOST:PORT` (PORT 0..65535; 0 or `*` means any). InvalidArgument names the part.
absl::StatusOr<TcpEndpoint> ParseTcpEndpoint(std::string_view text);

// Binds `socket` to `endpoint` (`tcp://HOST:0` picks a free port) and returns the endpoint it
// is actually bound to, with the real port. Unavailable when the address is taken.
absl::StatusOr<std::string> BindZmq(zmq::socket_t& socket, std::string_view endpoint);

// Sets the options every Connex socket uses: no linger on close, a bounded message size.
void ConfigureZmqSocket(zmq::socket_t& socket, int64_t max_message_bytes);

// Receives all parts of one message without blocking (false when none is pending).
absl::StatusOr<bool> RecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* parts);

inline std::string_view AsView(const zmq::message_t& m) {
  return std::string_view(static_cast<const char*>(m.data()), m.size());
}

}  // namespace connex

#endif  // CONNEX_BASE_ZMQ_UTIL_H_
