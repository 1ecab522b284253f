#include "connex/serving/http_server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <deque>
#include <exception>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
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

absl::StatusOr<size_t> EnvSize(std::string_view name, size_t default_value, size_t min,
                               size_t max) {
  std::optional<std::string> text = GetEnv(name);
  if (!text) return default_value;
  absl::StatusOr<uint64_t> size = ParseSize(*text);
  if (!size.ok() || *size < min || *size > max) {
    return absl::InvalidArgumentError(AsAbsl(
        StrCat(name, "='", *text, "' is not a size in [", min, ", ", max, "] bytes")));
  }
  return static_cast<size_t>(*size);
}

// How long a connection that is being closed keeps reading (and discarding) what its client
// still sends, so that the client reads our last response instead of a reset.
constexpr int64_t kMaxLingerMs = 1000;

// Connections over the limit that may wait for their 503 at the same time; past that they are
// closed at once (each holds a descriptor for up to kMaxLingerMs).
constexpr int kMaxRefusing = 1024;

}  // namespace

absl::StatusOr<HttpServerOptions> HttpServerOptions::FromEnv() {
  HttpServerOptions o;
  CONNEX_ASSIGN_OR_RETURN(o.max_header_bytes,
                          EnvSize("CONNEX_HTTP_MAX_HEADER_BYTES", o.max_header_bytes, 1024,
                                  1 << 20));
  CONNEX_ASSIGN_OR_RETURN(o.max_body_bytes, EnvSize("CONNEX_HTTP_MAX_BODY_BYTES", o.max_body_bytes,
                                                    1024, size_t{1} << 30));
  CONNEX_ASSIGN_OR_RETURN(o.read_timeout_ms,
                          EnvInt("CONNEX_HTTP_READ_TIMEOUT_MS", o.read_timeout_ms, 1, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(o.write_timeout_ms, EnvInt("CONNEX_HTTP_WRITE_TIMEOUT_MS",
                                                     o.write_timeout_ms, 1, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(int64_t connections,
                          EnvInt("CONNEX_HTTP_MAX_CONNECTIONS", o.max_connections, 1, 1'000'000));
  o.max_connections = static_cast<int>(connections);
  CONNEX_ASSIGN_OR_RETURN(int64_t threads, EnvInt("CONNEX_HTTP_THREADS", o.handler_threads, 1, 256));
  o.handler_threads = static_cast<int>(threads);
  CONNEX_ASSIGN_OR_RETURN(o.drain_timeout_ms, EnvInt("CONNEX_HTTP_DRAIN_TIMEOUT_MS",
                                                     o.drain_timeout_ms, 0, 86'400'000));
  return o;
}

std::string_view HttpRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      return value;
    }
  }
  return {};
}

namespace internal {

// What exchanges share with the server: the I/O context to post to, as long as it exists.
struct ServerCore {
  explicit ServerCore(net::io_context* io_context) : io(io_context) {}

  // Runs `fn` on the I/O thread; false once the server has stopped.
  bool Post(std::function<void()> fn) {
    MutexLock lock(&mu);
    if (stopped) return false;
    net::post(*io, std::move(fn));
    return true;
  }

  Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  net::io_context* const io;
  std::atomic<int64_t> cancelled{0};
};

}  // namespace internal

HttpExchange::HttpExchange(Passkey, std::shared_ptr<internal::ServerCore> core,
                           std::weak_ptr<internal::Connection> connection, HttpRequest request,
                           size_t max_pending_write_bytes)
    : core_(std::move(core)),
      connection_(std::move(connection)),
      request_(std::move(request)),
      max_pending_write_bytes_(max_pending_write_bytes) {}

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

// One client connection. Every member is used on the I/O thread only.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  struct Server {
    const HttpServerOptions& options;
    const HttpHandler& handler;
    std::shared_ptr<ServerCore> core;
    net::thread_pool& pool;
    std::atomic<int64_t>& requests;
    std::function<bool()> stopping;
    std::function<void(Connection*)> forget;  // from the destructor
  };

  Connection(Server server, tcp::socket socket)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {}
  ~Connection() { server_.forget(this); }

  void Start() { ReadRequest(); }

  // Over the connection limit: a 503 without reading the request.
  void Refuse(int limit) {
    keep_alive_ = false;
    WriteError(503, StrCat("the server is at its limit of ", limit, " connections; retry later"),
               "server_overloaded");
  }

  // The server stops: close now if idle, else after the current response.
  void OnStopping() {
    keep_alive_ = false;
    if (phase_ == Phase::kReadingHead && !ReceivedSome()) Close();
  }

  // The server stops for good: cancel the request in flight, close.
  void Abort() { ClientGone(); }

  // HttpExchange's requests, run on the I/O thread.
  void WriteResponse(HttpResponse response) {
    auto message = std::make_shared<http::response<http::string_body>>();
    message->result(static_cast<unsigned>(response.status));
    message->version(11);
    message->set(http::field::server, "connex");
    message->set(http::field::content_type, response.content_type);
    for (auto& [name, value] : response.headers) message->set(name, value);
    message->body() = std::move(response.body);
    message->keep_alive(keep_alive_ && !server_.stopping());
    message->prepare_payload();
    keep_alive_ = message->keep_alive();
    Queue(Write{Write::kMessage, std::move(message), {}, /*ends_response=*/true});
  }

  void WriteStreamHead(int status, std::string content_type) {
    stream_head_ = {};
    stream_head_.result(static_cast<unsigned>(status));
    stream_head_.version(11);
    stream_head_.set(http::field::server, "connex");
    stream_head_.set(http::field::content_type, content_type);
    stream_head_.set(http::field::cache_control, "no-cache");
    stream_head_.keep_alive(keep_alive_ && !server_.stopping());
    stream_head_.chunked(true);
    keep_alive_ = stream_head_.keep_alive();
    Queue(Write{Write::kHead, nullptr, {}, false});
  }

  void WriteChunk(std::string data) { Queue(Write{Write::kChunk, nullptr, std::move(data), false}); }
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

  bool ReceivedSome() const { return buffer_.size() > 0 || (parser_ && parser_->got_some()); }

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
    timed_out_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_.options.max_header_bytes));
    parser_->body_limit(server_.options.max_body_bytes);
    if (!keep_alive_ && requests_ > 0) return GracefulClose();
    ArmReadDeadline(server_.options.read_timeout_ms);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](ErrorCode ec, size_t) { self->OnHead(ec); });
  }

  void OnHead(ErrorCode ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec) return OnReadError(ec);
    phase_ = Phase::kReadingBody;
    if (parser_->is_done()) return OnRequest();
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
      if (self->phase_ == Phase::kClosed) return;
      if (ec) return self->OnReadError(ec);
      self->OnRequest();
    });
  }

  void OnReadError(ErrorCode ec) {
    DisarmReadDeadline();
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
      return WriteError(431,
                        StrCat("the request line and headers are larger than ",
                               server_.options.max_header_bytes,
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
    ++requests_;
    server_.requests.fetch_add(1);
    http::request<http::string_body> message = parser_->release();
    parser_.reset();
    keep_alive_ = keep_alive_ && message.keep_alive();
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
                                               server_.options.max_pending_write_bytes);
    Monitor();
    net::post(server_.pool, [handler = &server_.handler, exchange = exchange_] {
      try {
        (*handler)(exchange);
      } catch (const std::exception& e) {
        CONNEX_LOG_ERROR("http: handler of {} {} threw: {}", exchange->request().method,
                         exchange->request().target, e.what());
        exchange->Respond(HttpResponse{500, "application/json",
                                       ErrorEnvelope(500, "internal error", "", "internal_error"),
                                       {}});
      }
    });
  }

  // While the handler works, a read notices a client that closes the connection. Bytes that a
  // pipelining client sends meanwhile stay in buffer_ for the next request (up to a header's
  // worth; past that the connection is no longer watched until the response is done).
  void Monitor() {
    if (monitor_pending_ || buffer_.size() >= server_.options.max_header_bytes) return;
    monitor_pending_ = true;
    socket_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](ErrorCode ec, size_t n) {
                              self->OnMonitor(ec, n);
                            });
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
    WriteResponse(HttpResponse{status, "application/json", ErrorEnvelope(status, message, "", code),
                               {}});
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
        net::async_write(socket_, http::make_chunk(net::buffer(write.data)), std::move(done));
        break;
      case Write::kLast:
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
    socket_.async_read_some(net::buffer(discard_), [self = shared_from_this()](ErrorCode ec,
                                                                               size_t) {
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

  Server server_;
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

bool HttpExchange::StartStream(int status, std::string content_type) {
  {
    MutexLock lock(&mu_);
    if (state_ != State::kNew || cancelled_) return false;
    state_ = State::kStreaming;
  }
  return Post([status, content_type = std::move(content_type)](internal::Connection& c) mutable {
    c.WriteStreamHead(status, std::move(content_type));
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

namespace {

// Every member but the counters is used on the I/O thread only, unless stated.
class BeastHttpServer final : public HttpServer {
 public:
  BeastHttpServer(const HttpServerOptions& options, HttpHandler handler)
      : options_(options),
        handler_(std::move(handler)),
        io_(std::make_unique<net::io_context>()),
        core_(std::make_shared<internal::ServerCore>(io_.get())),
        pool_(static_cast<size_t>(std::max(1, options.handler_threads))),
        acceptor_(std::in_place, *io_),
        retry_timer_(std::in_place, *io_) {}

  ~BeastHttpServer() override { Stop(); }

  absl::Status Bind() {
    ErrorCode ec;
    net::ip::address address = net::ip::make_address(options_.host, ec);
    if (ec) {
      tcp::resolver resolver(*io_);
      auto results = resolver.resolve(options_.host, "", ec);
      if (ec || results.empty()) {
        return absl::InvalidArgumentError(
            AsAbsl(StrCat("http: cannot resolve host '", options_.host, "': ", ec.message())));
      }
      address = results.begin()->endpoint().address();
    }
    tcp::endpoint endpoint(address, options_.port);
    acceptor_->open(endpoint.protocol(), ec);
    if (!ec) acceptor_->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(AsAbsl(
          StrCat("http: cannot listen on ", options_.host, ":", options_.port, ": ", ec.message())));
    }
    port_ = acceptor_->local_endpoint(ec).port();
    return absl::OkStatus();
  }

  void Run() {
    Accept();
    io_thread_ = std::thread([this] {
      auto work = net::make_work_guard(*io_);
      while (true) {
        try {
          io_->run();
          return;
        } catch (const std::exception& e) {
          CONNEX_LOG_ERROR("http: I/O loop: {}", e.what());
        }
      }
    });
  }

  uint16_t port() const override { return port_; }
  std::string address() const override { return StrCat(options_.host, ":", port_); }

  Stats stats() const override {
    Stats stats;
    {
      MutexLock lock(&mu_);
      stats.open_connections = open_;
    }
    stats.accepted_connections = accepted_.load();
    stats.refused_connections = refused_.load();
    stats.requests = requests_.load();
    stats.cancelled = core_->cancelled.load();
    return stats;
  }

  void Stop() override {
    if (stop_called_.exchange(true)) return;
    net::post(*io_, [this] {
      stopping_ = true;
      ErrorCode ignored;
      acceptor_->close(ignored);
      retry_timer_->cancel();
      for (auto& [c, refused] : connections_) c->OnStopping();
    });
    if (!AwaitNoConnections(options_.drain_timeout_ms)) {
      net::post(*io_, [this] {
        // Abort closes; the connections go once their pending handlers have run.
        for (auto& [c, refused] : connections_) c->Abort();
      });
      AwaitNoConnections(kMaxLingerMs + 1000);
    }
    {
      MutexLock lock(&core_->mu);
      core_->stopped = true;  // exchanges post nothing from now on
    }
    io_->stop();
    if (io_thread_.joinable()) io_thread_.join();
    pool_.join();  // handlers still running finish; their exchanges are inert
    acceptor_.reset();
    retry_timer_.reset();
    io_.reset();  // destroys what was still queued, and with it the last connections
  }

 private:
  bool AwaitNoConnections(int64_t timeout_ms) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](int64_t* open) { return *open == 0; }, &open_),
                                absl::Milliseconds(timeout_ms));
  }

  internal::Connection::Server ServerView() {
    return internal::Connection::Server{
        options_, handler_, core_, pool_, requests_, [this] { return stopping_; },
        [this](internal::Connection* c) {
          auto it = connections_.find(c);
          if (it != connections_.end()) {
            --(it->second ? refusing_ : serving_);
            connections_.erase(it);
          }
          MutexLock lock(&mu_);
          --open_;
        }};
  }

  void Accept() {
    acceptor_->async_accept([this](ErrorCode ec, tcp::socket socket) {
      if (stopping_ || ec == net::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors, say: try again shortly rather than spin.
        CONNEX_LOG_WARN("http: accept on {}: {}", address(), ec.message());
        retry_timer_->expires_after(std::chrono::milliseconds(50));
        retry_timer_->async_wait([this](ErrorCode ec) {
          if (!ec && !stopping_) Accept();
        });
        return;
      }
      accepted_.fetch_add(1);
      bool refuse = serving_ >= options_.max_connections;
      if (refuse && refusing_ >= kMaxRefusing) {
        refused_.fetch_add(1);  // far over the limit: not even a 503
      } else {
        auto connection = std::make_shared<internal::Connection>(ServerView(), std::move(socket));
        connections_.emplace(connection.get(), refuse);
        ++(refuse ? refusing_ : serving_);
        {
          MutexLock lock(&mu_);
          ++open_;
        }
        if (refuse) {
          refused_.fetch_add(1);
          connection->Refuse(options_.max_connections);
        } else {
          connection->Start();
        }
      }
      Accept();
    });
  }

  const HttpServerOptions options_;
  const HttpHandler handler_;
  std::unique_ptr<net::io_context> io_;
  std::shared_ptr<internal::ServerCore> core_;
  net::thread_pool pool_;
  std::optional<tcp::acceptor> acceptor_;
  std::optional<net::steady_timer> retry_timer_;
  std::thread io_thread_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_called_{false};

  // I/O thread only.
  bool stopping_ = false;
  absl::flat_hash_map<internal::Connection*, bool> connections_;  // -> refused
  int serving_ = 0;
  int refusing_ = 0;

  mutable Mutex mu_;
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> requests_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpServer(const HttpServerOptions& options,
                                                            HttpHandler handler) {
  if (!handler) return absl::InvalidArgumentError("http: a handler is required");
  if (options.max_connections < 1 || options.handler_threads < 1 ||
      options.read_timeout_ms < 1 || options.write_timeout_ms < 1) {
    return absl::InvalidArgumentError(
        "http: max_connections, handler_threads and the timeouts must be positive");
  }
  auto server = std::make_unique<BeastHttpServer>(options, std::move(handler));
  CONNEX_RETURN_IF_ERROR(server->Bind());
  server->Run();
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace connex::serving
