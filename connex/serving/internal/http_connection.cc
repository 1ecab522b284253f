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

#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "connex/base/logging.h"
#include "connex/base/strings.h"
#include "connex/serving/api_error.h"

namespace connex::serving {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

namespace {

std::string_view View(boost::beast::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace

HttpExchange::HttpExchange(Passkey, std::shared_ptr<internal::ServerCore> core,
                           std::weak_ptr<internal::Connection> connection, HttpRequest request,
                           size_t max_pending_write_bytes, size_t body_charge)
    : core_(std::move(core)),
      connection_(std::move(connection)),
      request_(std::move(request)),
      max_pending_write_bytes_(max_pending_write_bytes),
      body_charge_(body_charge) {}

HttpExchange::~HttpExchange() { core_->ReleaseBody(body_charge_); }

bool HttpExchange::Post(std::function<void(internal::Connection&)> op) {
  // The connection is locked on the I/O thread, so it is only ever destroyed there.
  return core_->Post([connection = connection_, op = std::move(op)] {
    if (std::shared_ptr<internal::Connection> c = connection.lock()) op(*c);
  });
}

bool HttpExchange::cancelled() const {
  MutexLock lock(&mu_);
  return cancelled_;
}

void HttpExchange::OnCancel(std::function<void()> on_cancel) {
  {
    MutexLock lock(&mu_);
    if (!cancelled_) {
      on_cancel_ = std::move(on_cancel);
      return;
    }
  }
  on_cancel();
}

void HttpExchange::Cancel() {
  std::function<void()> on_cancel;
  {
    MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    on_cancel = std::move(on_cancel_);
  }
  core_->cancelled.fetch_add(1);
  if (on_cancel) on_cancel();
}

void HttpExchange::Written(size_t bytes) {
  MutexLock lock(&mu_);
  pending_bytes_ -= std::min(bytes, pending_bytes_);
}

namespace internal {

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

// One client connection. Every member is used on the I/O thread only.
class Connection final : public ConnectionHandle, public std::enable_shared_from_this<Connection> {
 public:
  Connection(ConnectionContext server, tcp::socket socket)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {}
  ~Connection() override {
    // Every end of a connection ends its request (the handler may hold the exchange for long).
    if (exchange_ != nullptr) exchange_->Cancel();
    server_.core->ReleaseBody(std::exchange(body_charge_, 0));
    server_.forget(this);
  }

  void Start() override { ReadRequest(); }

  void Refuse(int limit) override {
    keep_alive_ = false;
    WriteError(503, StrCat("the server is at its limit of ", limit, " connections; retry later"),
               "server_overloaded");
  }

  void OnStopping() override {
    keep_alive_ = false;
    if (phase_ == Phase::kReadingHead && !ReceivedSome()) Close();
  }

  void Abort() override { ClientGone(); }

  int64_t WaitingSinceMs() const override {
    return phase_ == Phase::kReadingHead || phase_ == Phase::kReadingBody ? waiting_since_ms_ : -1;
  }

  void Evict() override {
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

  // HttpExchange's requests, run on the I/O thread.
  void WriteResponse(HttpResponse response) {
    auto message = std::make_shared<http::response<http::string_body>>();
    message->result(static_cast<unsigned>(response.status));
    message->version(version_);
    message->set(http::field::server, "connex");
    message->set(http::field::content_type, response.content_type);
    for (auto& [name, value] : response.headers) message->set(name, value);
    message->body() = std::move(response.body);
    message->keep_alive(keep_alive_ && !server_.stopping());
    message->prepare_payload();
    keep_alive_ = message->keep_alive();
    Queue(Write{Write::kMessage, std::move(message), {}, /*ends_response=*/true});
  }

  void WriteStreamHead(int status, std::string content_type,
                       const std::vector<std::pair<std::string, std::string>>& headers) {
    stream_head_ = {};
    stream_head_.result(static_cast<unsigned>(status));
    stream_head_.version(version_);
    stream_head_.set(http::field::server, "connex");
    stream_head_.set(http::field::content_type, content_type);
    stream_head_.set(http::field::cache_control, "no-cache");
    for (const auto& [name, value] : headers) stream_head_.set(name, value);
    // HTTP/1.0 has no chunked encoding: the stream is the body as it comes, ended by the close.
    chunked_ = version_ >= 11;
    stream_head_.keep_alive(chunked_ && keep_alive_ && !server_.stopping());
    if (chunked_) stream_head_.chunked(true);
    keep_alive_ = stream_head_.keep_alive();
    Queue(Write{Write::kHead, nullptr, {}, false});
  }

  void WriteChunk(std::string data) {
    Queue(Write{Write::kChunk, nullptr, std::move(data), false});
  }
  void WriteLastChunk() { Queue(Write{Write::kLast, nullptr, {}, true}); }

  void ClientGone() {
    if (exchange_ != nullptr) exchange_->Cancel();
    exchange_.reset();
    Close();
  }

 private:
  enum class Phase { kReadingHead, kReadingBody, kHandling, kLingering, kClosed };
  // What a pending monitor read hands over to when it completes.
  enum class AfterMonitor { kNothing, kReadRequest, kLinger };

  struct Write {
    enum Kind { kMessage, kHead, kChunk, kLast } kind;
    std::shared_ptr<http::response<http::string_body>> message;
    std::string data;
    bool ends_response;
  };

  // Bytes of a request read, or already waiting in the socket (a request sent just before the
  // server stopped is served, not reset).
  bool ReceivedSome() {
    if (buffer_.size() > 0 || (parser_ && parser_->got_some())) return true;
    ErrorCode ec;
    return socket_.available(ec) > 0 && !ec;
  }

  void ArmReadDeadline(int64_t ms) {
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
  void DisarmReadDeadline() {
    ++read_deadline_;
    read_timer_.cancel();
  }

  void ReadRequest() {
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
    http::async_read_header(
        socket_, buffer_, *parser_,
        [self = shared_from_this()](ErrorCode ec, size_t) { self->OnHead(ec); });
  }

  void OnHead(ErrorCode ec) {
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
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](ErrorCode ec, size_t) {
      if (self->phase_ == Phase::kClosed || self->phase_ == Phase::kHandling) return;
      if (ec) return self->OnReadError(ec);
      self->OnRequest();
    });
  }

  void OnReadError(ErrorCode ec) {
    DisarmReadDeadline();
    server_.core->ReleaseBody(std::exchange(body_charge_, 0));
    keep_alive_ = false;
    if (timed_out_) {
      if (!ReceivedSome()) return Close();
      return WriteError(408,
                        StrCat("the request did not arrive whole within ",
                               server_.options.read_timeout_ms, " ms"),
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

  void OnRequest() {
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
        exchange->Respond(HttpResponse{500,
                                       "application/json",
                                       ErrorEnvelope(500, "internal error", "", "internal_error"),
                                       {}});
      }
    };
    // Cheap, non-blocking handlers (health, metrics) run here: never behind busy handler threads.
    if (server_.run_inline && server_.run_inline(exchange_->request())) return run();
    net::post(server_.pool, std::move(run));
  }

  // While the handler works, a read notices a client that closes the connection. Bytes that a
  // pipelining client sends meanwhile stay in buffer_ for the next request, up to a header's
  // worth; past that they are read and discarded and the connection closes after this response
  // (the client retries what was not answered), so that the read goes on watching: a connection
  // that ends for any reason cancels its request.
  void Monitor() {
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

  void OnMonitor(ErrorCode ec, size_t n) {
    monitor_pending_ = false;
    if (phase_ == Phase::kClosed) return;
    if (!ec) buffer_.commit(n);
    AfterMonitor next = std::exchange(after_monitor_, AfterMonitor::kNothing);
    if (next == AfterMonitor::kReadRequest) return ReadRequest();
    if (next == AfterMonitor::kLinger) return Linger();
    if (ec) return ClientGone();
    if (phase_ == Phase::kHandling) Monitor();
  }

  void WriteError(int status, std::string message, std::string_view code) {
    keep_alive_ = false;
    phase_ = Phase::kHandling;
    response_complete_ = false;
    WriteResponse(
        HttpResponse{status, "application/json", ErrorEnvelope(status, message, "", code), {}});
  }

  void Queue(Write write) {
    if (phase_ == Phase::kClosed) return;
    writes_.push_back(std::move(write));
    WriteNext();
  }

  void WriteNext() {
    if (writing_ || writes_.empty() || phase_ == Phase::kClosed) return;
    writing_ = true;
    uint64_t generation = ++write_deadline_;
    write_timer_.expires_after(std::chrono::milliseconds(server_.options.write_timeout_ms));
    write_timer_.async_wait([self = shared_from_this(), generation](ErrorCode ec) {
      if (ec || generation != self->write_deadline_) return;
      self->ClientGone();  // reads too slowly
    });
    auto done = [self = shared_from_this()](ErrorCode ec, size_t) { self->OnWritten(ec); };
    Write& write = writes_.front();
    switch (write.kind) {
      case Write::kMessage:
        http::async_write(socket_, *write.message, std::move(done));
        break;
      case Write::kHead:
        stream_serializer_.emplace(stream_head_);
        http::async_write_header(socket_, *stream_serializer_, std::move(done));
        break;
      case Write::kChunk:
        if (!chunked_) {
          net::async_write(socket_, net::buffer(write.data), std::move(done));
          break;
        }
        net::async_write(socket_, http::make_chunk(net::buffer(write.data)), std::move(done));
        break;
      case Write::kLast:
        if (!chunked_) {  // nothing to write: the close ends an HTTP/1.0 stream
          net::post(socket_.get_executor(),
                    [done = std::move(done)]() mutable { done(ErrorCode{}, 0); });
          break;
        }
        net::async_write(socket_, http::make_chunk_last(), std::move(done));
        break;
    }
  }

  void OnWritten(ErrorCode ec) {
    writing_ = false;
    ++write_deadline_;
    write_timer_.cancel();
    if (phase_ == Phase::kClosed) return;
    if (ec) return ClientGone();
    Write write = std::move(writes_.front());
    writes_.pop_front();
    if (write.kind == Write::kChunk && exchange_ != nullptr) exchange_->Written(write.data.size());
    if (!write.ends_response) return WriteNext();
    response_complete_ = true;
    exchange_.reset();
    writes_.clear();
    if (!keep_alive_ || server_.stopping()) return GracefulClose();
    if (monitor_pending_) {
      after_monitor_ = AfterMonitor::kReadRequest;
      ErrorCode ignored;
      socket_.cancel(ignored);
      return;
    }
    ReadRequest();
  }

  // Sends FIN, then reads and discards what the client still sends until it closes too (or a
  // short deadline passes), so that it reads the last response rather than a reset.
  void GracefulClose() {
    ErrorCode ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    if (monitor_pending_) {
      after_monitor_ = AfterMonitor::kLinger;
      socket_.cancel(ignored);
      return;
    }
    Linger();
  }

  void Linger() {
    if (phase_ != Phase::kLingering) {
      phase_ = Phase::kLingering;
      ArmReadDeadline(std::min(kMaxLingerMs, server_.options.read_timeout_ms));
    }
    socket_.async_read_some(net::buffer(discard_),
                            [self = shared_from_this()](ErrorCode ec, size_t) {
                              if (self->phase_ == Phase::kClosed) return;
                              if (ec) return self->Close();
                              self->Linger();
                            });
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    ErrorCode ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    DisarmReadDeadline();
    ++write_deadline_;
    write_timer_.cancel();
  }

  ConnectionContext server_;
  tcp::socket socket_;
  net::steady_timer read_timer_;
  net::steady_timer write_timer_;
  uint64_t read_deadline_ = 0;   // generation of the armed read deadline
  uint64_t write_deadline_ = 0;  // generation of the armed write deadline
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kReadingHead;
  bool timed_out_ = false;
  bool keep_alive_ = true;
  int64_t waiting_since_ms_ = -1;  // WaitingSinceMs
  size_t body_charge_ = 0;         // of the body being read (the exchange takes it over)
  unsigned version_ = 11;          // of the request being answered: 10 or 11
  bool chunked_ = true;            // the stream being written is chunked (not to HTTP/1.0)
  int64_t requests_ = 0;
  std::shared_ptr<HttpExchange> exchange_;
  bool response_complete_ = true;
  bool monitor_pending_ = false;
  AfterMonitor after_monitor_ = AfterMonitor::kNothing;
  std::deque<Write> writes_;
  bool writing_ = false;
  http::response<http::empty_body> stream_head_;
  std::optional<http::response_serializer<http::empty_body>> stream_serializer_;
  std::array<char, 4096> discard_;
};

std::shared_ptr<ConnectionHandle> NewConnection(ConnectionContext context, tcp::socket socket) {
  return std::make_shared<Connection>(std::move(context), std::move(socket));
}

}  // namespace internal

bool HttpExchange::Respond(HttpResponse response) {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kNew || cancelled_) return false;
    state_ = State::kDone;
  }
  return Post([response = std::move(response)](internal::Connection& c) mutable {
    c.WriteResponse(std::move(response));
  });
}

bool HttpExchange::StartStream(int status, std::string content_type,
                               std::vector<std::pair<std::string, std::string>> headers) {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kNew || cancelled_) return false;
    state_ = State::kStreaming;
  }
  return Post([status, content_type = std::move(content_type),
               headers = std::move(headers)](internal::Connection& c) mutable {
    c.WriteStreamHead(status, std::move(content_type), headers);
  });
}

bool HttpExchange::Send(std::string data) {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kStreaming || cancelled_) return false;
    if (data.empty()) return true;
    if (pending_bytes_ + data.size() <= max_pending_write_bytes_) {
      pending_bytes_ += data.size();
      return Post([data = std::move(data)](internal::Connection& c) mutable {
        c.WriteChunk(std::move(data));
      });
    }
  }
  // The client reads slower than the stream is produced: drop it.
  Post([](internal::Connection& c) { c.ClientGone(); });
  return false;
}

void HttpExchange::EndStream() {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kStreaming) return;
    state_ = State::kDone;
  }
  Post([](internal::Connection& c) { c.WriteLastChunk(); });
}

}  // namespace connex::serving
