// A blocking HTTP/1.1 client whose every call ends by a deadline: a plain socket waited on with
// poll, and Beast's parser (sans I/O) reading the responses. For the blocking callers that must
// never hang on a server that accepts and then says nothing: `connexctl status`'s health probes
// (deployment.h), the proxy's /tokenize and /detokenize forwards (internal/forward.h) and
// connex-chaos's load and checks.
//
// (Beast's own blocking calls cannot be bounded — "timeouts are not available when performing
// blocking calls" — and its asynchronous ones cost a loop per call and much compile time.)
// Thread-compatible: a connection is used by one thread at a time.
#ifndef CONNEX_SERVING_HTTP_CLIENT_H_
#define CONNEX_SERVING_HTTP_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace connex::serving {

// Steady-clock now in ns (CLOCK_MONOTONIC: the clock of the deadlines below).
int64_t SteadyNowNs();

struct HttpResponseHead {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  // The value of header `name` (case-insensitive), or nullopt.
  std::optional<std::string> Header(std::string_view name) const;
};

class HttpClientConnection {
 public:
  // Connects to `host` (a numeric IPv4 or IPv6 address) : `port` before `deadline_ns`
  // (SteadyNowNs). DeadlineExceeded when the deadline passed, Unavailable when refused,
  // InvalidArgument for a host that is not an address.
  static absl::StatusOr<std::unique_ptr<HttpClientConnection>> Connect(std::string_view host,
                                                                       uint16_t port,
                                                                       int64_t deadline_ns);
  ~HttpClientConnection();
  HttpClientConnection(const HttpClientConnection&) = delete;
  HttpClientConnection& operator=(const HttpClientConnection&) = delete;

  // Writes one request: `target` ("/health"), `headers` ("Name: value" each, without CRLF), a
  // body with its Content-Length when `body` is set (Content-Type `content_type`).
  absl::Status Send(std::string_view method, std::string_view target,
                    const std::vector<std::string>& headers, const std::optional<std::string>& body,
                    std::string_view content_type, int64_t deadline_ns);

  // Reads the response's head. DeadlineExceeded when it is not whole by the deadline;
  // Unavailable when the connection ends or breaks first or the bytes are not HTTP.
  absl::StatusOr<HttpResponseHead> ReadHead(int64_t deadline_ns);
  // After ReadHead: appends the body bytes that arrive next (at least one, unless the body is
  // over) to `*out`; false once the body is over. Errors as ReadHead's.
  absl::StatusOr<bool> ReadSome(std::string* out, int64_t deadline_ns);
  // After ReadHead: the rest of the body; ResourceExhausted once it is over `max_bytes`.
  absl::StatusOr<std::string> ReadBody(int64_t deadline_ns,
                                       size_t max_bytes = std::numeric_limits<size_t>::max());

 private:
  struct Parser;
  explicit HttpClientConnection(int fd);
  // Reads what the socket has (waiting until it has something) into the parser's input.
  absl::Status Fill(int64_t deadline_ns);
  // Feeds buffered input to the parser (internal::FeedResponseParser).
  absl::Status Parse();

  int fd_;
  std::unique_ptr<Parser> parser_;
  std::string input_;  // received, not yet parsed
  bool eof_ = false;
};

struct HttpReply {
  int status = 0;
  std::string body;
};
// GET `target` from host:port within `timeout_ms`, the whole exchange. Errors name the address,
// the target and what failed.
absl::StatusOr<HttpReply> HttpGet(std::string_view host, uint16_t port, std::string_view target,
                                  int64_t timeout_ms);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_HTTP_CLIENT_H_
