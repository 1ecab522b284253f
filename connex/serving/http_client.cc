#include "connex/serving/http_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/serving/internal/response_parser.h"

namespace connex::serving {
namespace {

namespace http = boost::beast::http;

// Waits until `fd` is ready for `events` or the deadline passes (DeadlineExceeded).
absl::Status WaitFor(int fd, short events, int64_t deadline_ns, std::string_view doing) {
  for (;;) {
    const int64_t left_ns = deadline_ns - SteadyNowNs();
    if (left_ns <= 0) return absl::DeadlineExceededError(StrCat(doing, ": timed out"));
    pollfd p{fd, events, 0};
    const int64_t left_ms = std::min<int64_t>((left_ns + 999'999) / 1'000'000, INT_MAX);
    const int n = ::poll(&p, 1, static_cast<int>(left_ms));
    if (n > 0) return absl::OkStatus();  // ready, or an error the next call reports
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(StrCat(doing, ": poll: ", std::strerror(errno)));
    }
  }
}

}  // namespace

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::optional<std::string> HttpResponseHead::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, absl::string_view(name.data(), name.size()))) return value;
  }
  return std::nullopt;
}

struct HttpClientConnection::Parser {
  Parser() { parser.body_limit(std::numeric_limits<uint64_t>::max()); }
  internal::ResponseParser parser;
};

HttpClientConnection::HttpClientConnection(int fd) : fd_(fd), parser_(std::make_unique<Parser>()) {}

HttpClientConnection::~HttpClientConnection() { ::close(fd_); }

absl::StatusOr<std::unique_ptr<HttpClientConnection>> HttpClientConnection::Connect(
    std::string_view host, uint16_t port, int64_t deadline_ns) {
  std::string address(host);
  if (address.size() > 2 && address.front() == '[' && address.back() == ']') {
    address = address.substr(1, address.size() - 2);
  }
  sockaddr_storage to{};
  socklen_t to_size = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&to);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&to);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    to_size = sizeof *v4;
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    to_size = sizeof *v6;
  } else {
    return absl::InvalidArgumentError(StrCat("\"", host, "\" is not a numeric address"));
  }
  const std::string where = StrCat("connect to ", host, ":", port);
  const int fd = ::socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(StrCat(where, ": socket: ", std::strerror(errno)));
  std::unique_ptr<HttpClientConnection> connection(new HttpClientConnection(fd));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), to_size) != 0) {
    if (errno != EINPROGRESS) {
      return absl::UnavailableError(StrCat(where, ": ", std::strerror(errno)));
    }
    CONNEX_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline_ns, where));
    int error = 0;
    socklen_t size = sizeof error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
    if (error != 0) return absl::UnavailableError(StrCat(where, ": ", std::strerror(error)));
  }
  return connection;
}

absl::Status HttpClientConnection::Send(std::string_view method, std::string_view target,
                                        const std::vector<std::string>& headers,
                                        const std::optional<std::string>& body,
                                        std::string_view content_type, int64_t deadline_ns) {
  std::string request = StrCat(method, " ", target, " HTTP/1.1\r\n");
  for (const std::string& h : headers) request += StrCat(h, "\r\n");
  if (body) {
    request += StrCat("Content-Type: ", content_type, "\r\nContent-Length: ", body->size(), "\r\n");
  }
  request += "\r\n";
  if (body) request += *body;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      CONNEX_RETURN_IF_ERROR(WaitFor(fd_, POLLOUT, deadline_ns, "send"));
    } else {
      return absl::UnavailableError(StrCat("send: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status HttpClientConnection::Fill(int64_t deadline_ns) {
  if (eof_) return absl::UnavailableError("the connection ended");
  char buffer[16384];
  for (;;) {
    const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    if (n > 0) {
      input_.append(buffer, static_cast<size_t>(n));
      return absl::OkStatus();
    }
    if (n == 0) {
      eof_ = true;
      return absl::OkStatus();
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(StrCat("receive: ", std::strerror(errno)));
    }
    CONNEX_RETURN_IF_ERROR(WaitFor(fd_, POLLIN, deadline_ns, "receive"));
  }
}

absl::Status HttpClientConnection::Parse() {
  return internal::FeedResponseParser(parser_->parser, input_, eof_);
}

absl::StatusOr<HttpResponseHead> HttpClientConnection::ReadHead(int64_t deadline_ns) {
  auto& parser = parser_->parser;
  for (;;) {
    CONNEX_RETURN_IF_ERROR(Parse());
    if (parser.is_header_done()) break;
    CONNEX_RETURN_IF_ERROR(Fill(deadline_ns));
  }
  HttpResponseHead head;
  head.status = static_cast<int>(parser.get().result_int());
  for (const auto& field : parser.get()) {
    head.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  return head;
}

absl::StatusOr<bool> HttpClientConnection::ReadSome(std::string* out, int64_t deadline_ns) {
  auto& parser = parser_->parser;
  for (;;) {
    CONNEX_RETURN_IF_ERROR(Parse());
    std::string& body = parser.get().body();
    if (!body.empty()) {
      out->append(body);
      body.clear();
      return true;
    }
    if (parser.is_done()) return false;
    CONNEX_RETURN_IF_ERROR(Fill(deadline_ns));
  }
}

absl::StatusOr<std::string> HttpClientConnection::ReadBody(int64_t deadline_ns, size_t max_bytes) {
  std::string body;
  for (;;) {
    CONNEX_ASSIGN_OR_RETURN(bool more, ReadSome(&body, deadline_ns));
    if (body.size() > max_bytes) {
      return absl::ResourceExhaustedError(StrCat("a body over ", max_bytes, " bytes"));
    }
    if (!more) return body;
  }
}

absl::StatusOr<HttpReply> HttpGet(std::string_view host, uint16_t port, std::string_view target,
                                  int64_t timeout_ms) {
  const int64_t deadline_ns = SteadyNowNs() + timeout_ms * 1'000'000;
  auto get = [&]() -> absl::StatusOr<HttpReply> {
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<HttpClientConnection> connection,
                            HttpClientConnection::Connect(host, port, deadline_ns));
    CONNEX_RETURN_IF_ERROR(
        connection->Send("GET", target, {StrCat("Host: ", host)}, std::nullopt, "", deadline_ns));
    CONNEX_ASSIGN_OR_RETURN(HttpResponseHead head, connection->ReadHead(deadline_ns));
    CONNEX_ASSIGN_OR_RETURN(std::string body, connection->ReadBody(deadline_ns));
    return HttpReply{head.status, std::move(body)};
  };
  absl::StatusOr<HttpReply> reply = get();
  if (!reply.ok()) {
    return absl::Status(reply.status().code(),
                        StrCat("GET ", host, ":", port, target, ": ", reply.status().message()));
  }
  return reply;
}

}  // namespace connex::serving
