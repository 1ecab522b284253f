#include "connex/serving/internal/forward.h"

#include <chrono>

#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "connex/base/strings.h"
#include "connex/serving/http_server.h"
#include "connex/serving/listen_address.h"

namespace connex::serving::internal {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

// One POST to one replica; the failure says what broke.
absl::StatusOr<ForwardedAnswer> PostTo(const Replica& replica, const std::string& target,
                                       const std::string& body, int64_t timeout_ms) {
  HttpServerOptions parsed;
  absl::Status address = ParseListenAddress("http", replica.http_address, &parsed);
  boost::system::error_code ec;
  asio::ip::address ip = asio::ip::make_address(parsed.host, ec);
  if (!address.ok() || ec || parsed.port == 0) {
    return absl::UnavailableError(
        StrCat(replica.name, ": its API address ", replica.http_address, " is not HOST:PORT"));
  }
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::milliseconds(timeout_ms));
  stream.connect(asio::ip::tcp::endpoint(ip, parsed.port), ec);
  if (ec) return absl::UnavailableError(StrCat(replica.name, ": connect: ", ec.message()));
  http::request<http::string_body> request(http::verb::post, target, 11);
  request.set(http::field::host, replica.http_address);
  request.set(http::field::content_type, "application/json");
  request.body() = body;
  request.prepare_payload();
  http::write(stream, request, ec);
  if (ec) return absl::UnavailableError(StrCat(replica.name, ": send: ", ec.message()));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(8u << 20);
  http::read(stream, buffer, parser, ec);
  if (ec) return absl::UnavailableError(StrCat(replica.name, ": read: ", ec.message()));
  beast::error_code ignored;
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  const auto& response = parser.get();
  return ForwardedAnswer{static_cast<int>(response.result_int()),
                         std::string(response[http::field::content_type]), response.body()};
}

}  // namespace

absl::StatusOr<ForwardedAnswer> ForwardToReplicas(const std::vector<Replica>& replicas,
                                                  const std::string& target,
                                                  const std::string& body, int64_t timeout_ms) {
  std::string failures;
  for (const Replica& replica : replicas) {
    absl::StatusOr<ForwardedAnswer> answer = PostTo(replica, target, body, timeout_ms);
    // A replica that is starting (503) may be followed by one that serves.
    if (answer.ok() && answer->status != 503) return answer;
    failures +=
        StrCat(failures.empty() ? "" : "; ", answer.ok() ? StrCat(replica.name, ": 503")
                                                         : std::string(answer.status().message()));
  }
  return absl::UnavailableError(
      replicas.empty() ? StrCat("no stage-0 replica is known to answer ", target)
                       : StrCat("no stage-0 replica answered ", target, " (", failures, ")"));
}

}  // namespace connex::serving::internal
