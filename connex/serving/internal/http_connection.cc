// The connection side of HttpServer (internal/http_connection.h): ServerCore's budget of request
// bodies, and Connection's life and reading (the class is internal/http_connection_impl.h) — a
// request's head and body read under their bounds and deadline, refused with the status that
// names the bound, handed to the handler, and watched for the client leaving meanwhile. Writing a
// response is http_connection_write.cc.
#include "connex/serving/internal/http_connection.h"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "connex/base/logging.h"
#include "connex/base/strings.h"
#include "connex/serving/api_error.h"
#include "connex/serving/internal/http_connection_impl.h"

namespace connex::serving::internal {
int64_t SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool ServerCore::ChargeBody(size_t bytes, size_t limit) {
  if (bytes == 0) return true;
  int64_t now = body_bytes.load();
  do {
    if (static_cast<size_t>(now) + bytes > limit) return false;
  } while (!body_bytes.compare_exchange_weak(now, now + static_cast<int64_t>(bytes)));
  if (now + static_cast<int64_t>(bytes) >= kTrimAfterBodyBytes) trim_due.store(true);
  return true;
}

void ServerCore::ReleaseBody(size_t bytes) {
  if (bytes == 0) return;
  if (body_bytes.fetch_sub(static_cast<int64_t>(bytes)) == static_cast<int64_t>(bytes) &&
      trim_due.exchange(false)) {
    malloc_trim(0);
  }
}

Connection::Connection(ConnectionContext server, tcp::socket socket)
    : server_(std::move(server)),
      socket_(std::move(socket)),
      read_timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()),
      keep_alive_timer_(socket_.get_executor()) {}

Connection::~Connection() {
  // Every end of a connection ends its request (the handler may hold the exchange for long).
  if (exchange_ != nullptr) exchange_->Cancel();
  server_.core->ReleaseBody(std::exchange(body_charge_, 0));
  server_.forget(this);
}

void Connection::Refuse(int limit) {
  keep_alive_ = false;
  WriteError(503, StrCat("the server is at its limit of ", limit, " connections; retry later"),
             "server_overloaded");
}

void Connection::OnStopping() {
  keep_alive_ = false;
  if (phase_ == Phase::kReadingHead && !ReceivedSome()) Close();
}

void Connection::Evict() {
  if (phase_ != Phase::kReadingHead && phase_ != Phase::kReadingBody) return;
  keep_alive_ = false;
  DisarmReadDeadline();
  if (!ReceivedSome()) return Close();
  // Its reads are cancelled; the 408 goes out meanwhile.
  ErrorCode ignored;
  socket_.cancel(ignored);
  WriteError(408,
             StrCat("the server is at its limit of ", server_.options.max_connections,
                    " connections and this request was the slowest to arrive"),
             "request_timeout");
}

void Connection::ClientGone() {
  if (exchange_ != nullptr) exchange_->Cancel();
  exchange_.reset();
  Close();
}

bool Connection::ReceivedSome() {
  if (buffer_.size() > 0 || (parser_ && parser_->got_some())) return true;
  ErrorCode ec;
  return socket_.available(ec) > 0 && !ec;
}

void Connection::ArmReadDeadline(int64_t ms) {
  uint64_t generation = ++read_deadline_;
  read_timer_.expires_after(std::chrono::milliseconds(ms));
  read_timer_.async_wait([self = shared_from_this(), generation](ErrorCode ec) {
    if (ec || generation != self->read_deadline_ || self->phase_ == Phase::kClosed) return;
    if (self->phase_ == Phase::kLingering) return self->Close();
    self->timed_out_ = true;
    ErrorCode ignored;
    self->socket_.cancel(ignored);
  });
}

void Connection::ReadRequest() {
  if (phase_ == Phase::kClosed) return;
  if (server_.stopping()) keep_alive_ = false;
  phase_ = Phase::kReadingHead;
  waiting_since_ms_ = SteadyNowMs();
  timed_out_ = false;
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(server_.options.max_header_bytes));
  parser_->body_limit(server_.options.max_body_bytes);
  if (!keep_alive_ && requests_ > 0) return GracefulClose();
  ArmReadDeadline(server_.options.read_timeout_ms);
  ReadMore();
}

// Beast's parser, sans I/O, on the socket's reads: its composed read operations cost this file
// most of its compile time for this loop.
void Connection::ReadMore() {
  auto wanted = [&] {
    return phase_ == Phase::kReadingHead ? parser_->is_header_done() : parser_->is_done();
  };
  while (buffer_.size() > 0 && !wanted()) {
    ErrorCode ec;
    const size_t used = parser_->put(buffer_.data(), ec);
    buffer_.consume(used);
    if (ec == http::error::need_more) break;
    if (ec) return OnReadError(ec);
    if (used == 0) break;
  }
  if (wanted()) return phase_ == Phase::kReadingHead ? OnHead({}) : OnRequest();
  socket_.async_read_some(
      buffer_.prepare(kReadBytes), [self = shared_from_this()](ErrorCode ec, size_t n) {
        if (self->phase_ == Phase::kClosed || self->phase_ == Phase::kHandling) {
          return;  // closed, evicted or refused meanwhile
        }
        self->buffer_.commit(n);
        if (ec == net::error::eof) return self->OnEndOfInput();
        if (ec) return self->OnReadError(ec);
        self->ReadMore();
      });
}

// The client closed its side: before a request began, the connection simply ends
// (end_of_stream); inside one, the parser says what is missing (partial_message), as Beast's
// reads do.
void Connection::OnEndOfInput() {
  if (buffer_.size() == 0 && !parser_->got_some()) return OnReadError(http::error::end_of_stream);
  // Bytes the parser could not take yet (a head not whole) stay buffered: the request is cut.
  if (buffer_.size() > 0) return OnReadError(http::error::partial_message);
  ErrorCode ec;
  parser_->put_eof(ec);
  if (ec) return OnReadError(ec);
  ReadMore();
}

void Connection::OnHead(ErrorCode ec) {
  if (phase_ == Phase::kClosed || phase_ == Phase::kHandling) return;  // closed or evicted
  if (ec) return OnReadError(ec);
  phase_ = Phase::kReadingBody;
  if (parser_->is_done()) return OnRequest();
  // The body counts against the server's budget while it is read and handled.
  if (boost::optional<uint64_t> length = parser_->content_length(); length && *length > 0) {
    if (!server_.core->ChargeBody(*length, server_.options.max_body_bytes_in_flight)) {
      server_.core->refused_bodies.fetch_add(1);
      DisarmReadDeadline();
      return WriteError(503,
                        StrCat("the server holds ", server_.options.max_body_bytes_in_flight,
                               " bytes of request bodies already "
                               "(CONNEX_HTTP_MAX_BODY_BYTES_IN_FLIGHT); retry later"),
                        "server_overloaded");
    }
    body_charge_ = *length;
  }
  auto expect = parser_->get().find(http::field::expect);
  if (expect != parser_->get().end() && beast::iequals(expect->value(), "100-continue")) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    net::async_write(socket_, net::buffer(kContinue.data(), kContinue.size()),
                     [self = shared_from_this()](ErrorCode ec, size_t) {
                       if (self->phase_ == Phase::kClosed) return;
                       if (ec) return self->Close();
                       self->ReadMore();
                     });
    return;
  }
  ReadMore();
}

void Connection::OnReadError(ErrorCode ec) {
  DisarmReadDeadline();
  server_.core->ReleaseBody(std::exchange(body_charge_, 0));
  keep_alive_ = false;
  if (timed_out_) {
    if (!ReceivedSome()) return Close();
    return WriteError(
        408,
        StrCat("the request did not arrive whole within ", server_.options.read_timeout_ms, " ms"),
        "request_timeout");
  }
  if (ec == http::error::body_limit) {
    return WriteError(413,
                      StrCat("the request body is larger than ", server_.options.max_body_bytes,
                             " bytes (CONNEX_HTTP_MAX_BODY_BYTES)"),
                      "request_too_large");
  }
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    return WriteError(
        431,
        StrCat("the request line and headers are larger than ", server_.options.max_header_bytes,
               " bytes (CONNEX_HTTP_MAX_HEADER_BYTES)"),
        "headers_too_large");
  }
  if (ec == http::error::end_of_stream || ec == net::error::eof ||
      ec == net::error::connection_reset || ec == net::error::operation_aborted ||
      !ReceivedSome()) {
    return Close();
  }
  WriteError(400, StrCat("malformed HTTP request: ", ec.message()), "invalid_http");
}

void Connection::OnRequest() {
  DisarmReadDeadline();
  phase_ = Phase::kHandling;
  waiting_since_ms_ = -1;
  http::request<http::string_body> message = parser_->release();
  parser_.reset();
  // A body without a Content-Length (chunked) is charged now that its size is known; the
  // exchange holds the charge from here on.
  size_t charge = std::exchange(body_charge_, 0);
  if (charge == 0 && !message.body().empty()) {
    charge = message.body().size();
    if (!server_.core->ChargeBody(charge, server_.options.max_body_bytes_in_flight)) {
      server_.core->refused_bodies.fetch_add(1);
      return WriteError(503,
                        StrCat("the server holds ", server_.options.max_body_bytes_in_flight,
                               " bytes of request bodies already "
                               "(CONNEX_HTTP_MAX_BODY_BYTES_IN_FLIGHT); retry later"),
                        "server_overloaded");
    }
  }
  version_ = message.version() >= 11 ? 11 : 10;
  keep_alive_ = keep_alive_ && message.keep_alive();
  if (auto coding = message.find(http::field::content_encoding);
      coding != message.end() && !beast::iequals(coding->value(), "identity")) {
    // Nothing here decodes a body: a compressed one parsed as JSON would be garbage.
    server_.core->ReleaseBody(charge);
    return WriteError(415,
                      StrCat("Content-Encoding \"", View(coding->value()),
                             "\" is not supported; send the body uncompressed"),
                      "unsupported_content_encoding");
  }
  ++requests_;
  server_.requests.fetch_add(1);
  HttpRequest request;
  request.method = std::string(View(message.method_string()));
  request.target = std::string(View(message.target()));
  request.path = request.target.substr(0, request.target.find('?'));
  for (const auto& field : message) {
    request.headers.emplace_back(std::string(View(field.name_string())),
                                 std::string(View(field.value())));
  }
  request.body = std::move(message.body());
  response_complete_ = false;
  exchange_ = std::make_shared<HttpExchange>(HttpExchange::Passkey(), server_.core,
                                             weak_from_this(), std::move(request),
                                             server_.options.max_pending_write_bytes, charge);
  Monitor();
  auto run = [handler = &server_.handler, exchange = exchange_] {
    try {
      (*handler)(exchange);
    } catch (const std::exception& e) {
      CONNEX_LOG_ERROR("http: handler of {} {} threw: {}", exchange->request().method,
                       exchange->request().target, e.what());
      exchange->Respond(HttpResponse{
          500, "application/json", ErrorEnvelope(500, "internal error", "", "internal_error"), {}});
    }
  };
  // Cheap, non-blocking handlers (health, metrics) run here: never behind busy handler threads.
  if (server_.run_inline && server_.run_inline(exchange_->request())) return run();
  net::post(server_.pool, std::move(run));
}

void Connection::Monitor() {
  if (monitor_pending_) return;
  monitor_pending_ = true;
  if (buffer_.size() >= server_.options.max_header_bytes) {
    keep_alive_ = false;
    socket_.async_read_some(
        net::buffer(discard_),
        [self = shared_from_this()](ErrorCode ec, size_t) { self->OnMonitor(ec, 0); });
    return;
  }
  socket_.async_read_some(
      buffer_.prepare(4096),
      [self = shared_from_this()](ErrorCode ec, size_t n) { self->OnMonitor(ec, n); });
}

void Connection::OnMonitor(ErrorCode ec, size_t n) {
  monitor_pending_ = false;
  if (phase_ == Phase::kClosed) return;
  if (!ec) buffer_.commit(n);
  AfterMonitor next = std::exchange(after_monitor_, AfterMonitor::kNothing);
  if (next == AfterMonitor::kReadRequest) return ReadRequest();
  if (next == AfterMonitor::kLinger) return Linger();
  if (ec) return ClientGone();
  if (phase_ == Phase::kHandling) Monitor();
}

std::shared_ptr<ConnectionHandle> NewConnection(ConnectionContext context, tcp::socket socket) {
  return std::make_shared<Connection>(std::move(context), std::move(socket));
}

}  // namespace connex::serving::internal
