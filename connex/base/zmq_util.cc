#include "connex/base/zmq_util.h"

#include "absl/strings/numbers.h"
#include "connex/base/strings.h"

namespace connex {

std::string TcpEndpoint::ToString() const { return StrCat("tcp://", host, ":", port); }

absl::StatusOr<TcpEndpoint> ParseTcpEndpoint(std::string_view text) {
  constexpr std::string_view kScheme = "tcp://";
  if (text.substr(0, kScheme.size()) != kScheme) {
    return absl::InvalidArgumentError(
        StrCat("endpoint '", text, "' must look like tcp://HOST:PORT"));
  }
  std::string_view rest = text.substr(kScheme.size());
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        StrCat("endpoint '", text, "' has no HOST:PORT after tcp://"));
  }
  TcpEndpoint ep;
  ep.host = std::string(rest.substr(0, colon));
  std::string_view port = rest.substr(colon + 1);
  if (port == "*") {
    ep.port = 0;
    return ep;
  }
  int value = -1;
  if (port.empty() || port.size() > 5 || !absl::SimpleAtoi(AsAbsl(port), &value) || value < 0 ||
      value > 65535) {
    return absl::InvalidArgumentError(
        StrCat("endpoint '", text, "': port '", port, "' is not a number in 0..65535"));
  }
  ep.port = value;
  return ep;
}

absl::StatusOr<std::string> BindZmq(zmq::socket_t& socket, std::string_view endpoint) {
  absl::StatusOr<TcpEndpoint> ep = ParseTcpEndpoint(endpoint);
  if (!ep.ok()) return ep.status();
  std::string zmq_endpoint = ep->port == 0 ? StrCat("tcp://", ep->host, ":*") : ep->ToString();
  try {
    socket.bind(zmq_endpoint);
    return socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(StrCat("cannot bind ", endpoint, ": ", e.what()));
  }
}

void ConfigureZmqSocket(zmq::socket_t& socket, int64_t max_message_bytes) {
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::maxmsgsize, max_message_bytes);
}

absl::StatusOr<bool> RecvMultipart(zmq::socket_t& socket, std::vector<zmq::message_t>* parts) {
  parts->clear();
  try {
    while (true) {
      zmq::message_t part;
      zmq::recv_result_t got = socket.recv(part, zmq::recv_flags::dontwait);
      if (!got) return !parts->empty();
      bool more = part.more();
      parts->push_back(std::move(part));
      if (!more) return true;
    }
  } catch (const zmq::error_t& e) {
    return absl::InternalError(StrCat("zmq recv: ", e.what()));
  }
}

}  // namespace connex
