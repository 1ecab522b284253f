#include "connex/serving/http_server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "boost/asio.hpp"
#include "connex/base/config.h"
#include "connex/base/curve.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/serving/internal/http_connection.h"

namespace connex::serving {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using ErrorCode = boost::system::error_code;

namespace {

absl::StatusOr<size_t> EnvSize(std::string_view name, size_t default_value, size_t min,
                               size_t max) {
  std::optional<std::string> text = GetEnv(name);
  if (!text) return default_value;
  absl::StatusOr<uint64_t> size = ParseSize(*text);
  if (!size.ok() || *size < min || *size > max) {
    return absl::InvalidArgumentError(
        AsAbsl(StrCat(name, "='", *text, "' is not a size in [", min, ", ", max, "] bytes")));
  }
  return static_cast<size_t>(*size);
}

// Connections over the limit that may wait for their 503 at the same time; past that they are
// closed at once (each holds a descriptor for up to internal::kMaxLingerMs).
constexpr int kMaxRefusing = 1024;

}  // namespace

absl::StatusOr<HttpServerOptions> HttpServerOptions::FromEnv() {
  HttpServerOptions o;
  CONNEX_ASSIGN_OR_RETURN(o.max_header_bytes, EnvSize("CONNEX_HTTP_MAX_HEADER_BYTES",
                                                      o.max_header_bytes, 1024, 1 << 20));
  CONNEX_ASSIGN_OR_RETURN(o.max_body_bytes, EnvSize("CONNEX_HTTP_MAX_BODY_BYTES", o.max_body_bytes,
                                                    1024, size_t{1} << 30));
  CONNEX_ASSIGN_OR_RETURN(o.read_timeout_ms,
                          EnvInt("CONNEX_HTTP_READ_TIMEOUT_MS", o.read_timeout_ms, 1, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(o.write_timeout_ms, EnvInt("CONNEX_HTTP_WRITE_TIMEOUT_MS",
                                                     o.write_timeout_ms, 1, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(int64_t connections,
                          EnvInt("CONNEX_HTTP_MAX_CONNECTIONS", o.max_connections, 1, 1'000'000));
  o.max_connections = static_cast<int>(connections);
  CONNEX_ASSIGN_OR_RETURN(o.max_body_bytes_in_flight,
                          EnvSize("CONNEX_HTTP_MAX_BODY_BYTES_IN_FLIGHT",
                                  o.max_body_bytes_in_flight, 1024, size_t{1} << 40));
  CONNEX_ASSIGN_OR_RETURN(int64_t threads,
                          EnvInt("CONNEX_HTTP_THREADS", o.handler_threads, 1, 256));
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

namespace {

// Every member but the counters is used on the I/O thread only, unless stated.
class BeastHttpServer final : public HttpServer {
 public:
  BeastHttpServer(const HttpServerOptions& options, HttpHandler handler, InlinePredicate run_inline)
      : options_(options),
        handler_(std::move(handler)),
        run_inline_(std::move(run_inline)),
        io_(std::make_unique<net::io_context>()),
        core_(std::make_shared<internal::ServerCore>(io_.get())),
        pool_(static_cast<size_t>(std::max(1, options.handler_threads))),
        acceptor_(std::in_place, *io_),
        retry_timer_(std::in_place, *io_) {}

  ~BeastHttpServer() override { Stop(); }

  absl::Status Bind() {
    // The API has no authentication of its own: beyond loopback only when told so.
    CONNEX_RETURN_IF_ERROR(CheckListenExposure("http", options_.host, /*authenticated=*/false));
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
      return absl::UnavailableError(AsAbsl(StrCat("http: cannot listen on ", options_.host, ":",
                                                  options_.port, ": ", ec.message())));
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
    stats.evicted_connections = evicted_.load();
    stats.refused_bodies = core_->refused_bodies.load();
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
      AwaitNoConnections(internal::kMaxLingerMs + 1000);
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

  internal::ConnectionContext Context() {
    return internal::ConnectionContext{options_,
                                       handler_,
                                       run_inline_,
                                       core_,
                                       pool_,
                                       requests_,
                                       [this] { return stopping_; },
                                       [this](internal::ConnectionHandle* c) {
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
      // Streamed responses are many small writes (a token each): without this, Nagle holds
      // each behind the ACK of the last.
      ErrorCode nodelay_ec;
      socket.set_option(tcp::no_delay(true), nodelay_ec);
      if (serving_ >= options_.max_connections) EvictSlowest();
      bool refuse = serving_ >= options_.max_connections;
      if (refuse && refusing_ >= kMaxRefusing) {
        refused_.fetch_add(1);  // far over the limit: not even a 503
      } else {
        std::shared_ptr<internal::ConnectionHandle> connection =
            internal::NewConnection(Context(), std::move(socket));
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

  // At the connection limit: closes the serving connection that has waited longest for its
  // request's bytes, if one waited long enough (its slot goes to the new connection).
  void EvictSlowest() {
    const int64_t now = internal::SteadyNowMs();
    internal::ConnectionHandle* slowest = nullptr;
    int64_t since = now - internal::kMinWaitBeforeEvictionMs;
    for (const auto& [c, refused] : connections_) {
      if (refused) continue;
      const int64_t waiting = c->WaitingSinceMs();
      if (waiting >= 0 && waiting <= since) {
        since = waiting;
        slowest = c;
      }
    }
    if (slowest == nullptr) return;
    evicted_.fetch_add(1);
    // Counted out at once: its close (and the forget that follows) may take a linger.
    auto it = connections_.find(slowest);
    it->second = true;
    --serving_;
    ++refusing_;
    slowest->Evict();
  }

  const HttpServerOptions options_;
  const HttpHandler handler_;
  const InlinePredicate run_inline_;
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
  absl::flat_hash_map<internal::ConnectionHandle*, bool> connections_;  // -> refused
  int serving_ = 0;
  int refusing_ = 0;

  mutable Mutex mu_;
  int64_t open_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> evicted_{0};
  std::atomic<int64_t> requests_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpServer(const HttpServerOptions& options,
                                                            HttpHandler handler,
                                                            InlinePredicate run_inline) {
  if (!handler) return absl::InvalidArgumentError("http: a handler is required");
  if (options.max_connections < 1 || options.handler_threads < 1 || options.read_timeout_ms < 1 ||
      options.write_timeout_ms < 1) {
    return absl::InvalidArgumentError(
        "http: max_connections, handler_threads and the timeouts must be positive");
  }
  auto server =
      std::make_unique<BeastHttpServer>(options, std::move(handler), std::move(run_inline));
  CONNEX_RETURN_IF_ERROR(server->Bind());
  server->Run();
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace connex::serving
