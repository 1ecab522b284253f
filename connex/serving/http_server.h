// HttpServer: the HTTP/1.1 server of connex-stage and connex-proxy, on Boost.Beast over Asio. It
// reads requests with Beast's parser under bounds (header size, body size, a deadline for the
// whole request against slow clients, a connection limit), hands each request to a handler as an
// HttpExchange, and writes either a whole response or a stream of chunks (server-sent events) as
// the handler produces them. A client that goes away before its response is complete cancels the
// exchange, so the request behind it can be released.
//
// Threads: one I/O thread runs every socket; handlers run on a small pool (`handler_threads`) and
// may keep their HttpExchange and answer later from any thread (HttpExchange is thread-safe).
// HttpServer's own methods are thread-safe. Stop() closes the listener, lets in-flight requests
// finish for `drain_timeout_ms`, then cancels the rest and joins every thread.
#ifndef CONNEX_SERVING_HTTP_SERVER_H_
#define CONNEX_SERVING_HTTP_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "connex/base/mutex.h"

namespace connex::serving {

// The limits are the CONNEX_HTTP_* variables of docs/configuration.md.
struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                    // 0: pick a free port (HttpServer::port() tells which)
  size_t max_header_bytes = 16 * 1024;  // request line and headers; more is a 431
  size_t max_body_bytes = 1 << 20;      // more is a 413, refused before the body is read
  // A request (head and body) must arrive whole within this time from when the connection is
  // ready for it (accepted, or its previous response written): slow clients get 408 and are
  // closed, idle keep-alive connections are closed.
  int64_t read_timeout_ms = 10'000;
  // One write to the client may take at most this long; a client that reads slower is dropped
  // and its request cancelled.
  int64_t write_timeout_ms = 30'000;
  // Streamed bytes queued for a client that has not read them yet; past this the client is
  // dropped and its request cancelled.
  size_t max_pending_write_bytes = 8 << 20;
  // Open connections. At the limit, a new connection takes the place of the one that has waited
  // longest for its request's bytes (a slow or idle client: slowloris cannot hold every slot),
  // if one has waited at least kMinWaitBeforeEvictionMs; else it is answered 503 and closed.
  int max_connections = 512;
  // Request bodies held at once (being read, or given to a handler), all connections together;
  // a request whose Content-Length would pass it is answered 503 before its body is read.
  size_t max_body_bytes_in_flight = 64 << 20;
  int handler_threads = 2;
  int64_t drain_timeout_ms = 5'000;

  // The defaults above, overridden by CONNEX_HTTP_MAX_HEADER_BYTES, CONNEX_HTTP_MAX_BODY_BYTES,
  // CONNEX_HTTP_READ_TIMEOUT_MS, CONNEX_HTTP_WRITE_TIMEOUT_MS, CONNEX_HTTP_MAX_CONNECTIONS,
  // CONNEX_HTTP_MAX_BODY_BYTES_IN_FLIGHT, CONNEX_HTTP_THREADS, CONNEX_HTTP_DRAIN_TIMEOUT_MS.
  // InvalidArgument names a bad variable.
  static absl::StatusOr<HttpServerOptions> FromEnv();
};

struct HttpRequest {
  std::string method;  // as sent: "GET", "POST", ...
  std::string target;  // "/v1/models?x=1"
  std::string path;    // target without the query: "/v1/models"
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // The first header called `name` (any case), or "" when absent.
  std::string_view Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones, e.g. Allow
};

namespace internal {
class Connection;
struct ServerCore;
}  // namespace internal

// One request and its response: exactly one of Respond, or StartStream + Send... + EndStream.
// Thread-safe. A handler that keeps the exchange must answer it eventually (or see it cancelled):
// the connection waits for the answer.
class HttpExchange {
 public:
  struct Passkey {
   private:
    friend class internal::Connection;
    Passkey() = default;
  };
  // `body_charge`: bytes of the server's body budget (max_body_bytes_in_flight) this exchange
  // holds until it is destroyed.
  HttpExchange(Passkey, std::shared_ptr<internal::ServerCore> core,
               std::weak_ptr<internal::Connection> connection, HttpRequest request,
               size_t max_pending_write_bytes, size_t body_charge);
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const HttpRequest& request() const { return request_; }

  // Sends a whole response. False when the exchange was already answered or cancelled.
  bool Respond(HttpResponse response);
  // Starts a streamed response: the head now (chunked transfer encoding, no caching; `headers`
  // added to it), the body in chunks by Send. False when already answered or cancelled.
  bool StartStream(int status = 200, std::string content_type = "text/event-stream",
                   std::vector<std::pair<std::string, std::string>> headers = {});
  // Queues `data` as one chunk (empty data is skipped). False once the client is gone, the queue
  // is over `max_pending_write_bytes` (the exchange is then cancelled), or the stream has ended.
  bool Send(std::string data);
  // Ends the stream; the connection then serves the client's next request.
  void EndStream();
  // While the stream is open, sends `data` as a chunk whenever nothing went for `every_ms` and
  // `alive()` (run on the server's I/O thread: it must not block) says the stream's producer is
  // still at work: a reader with an idle timeout (connex-proxy's) then tells a server that is
  // slow — waiting, or recovering from a failure behind it — from one that is hung or stopped.
  // For a server-sent event stream `data` is a comment (": keep-alive\n\n"), which readers skip.
  // False unless the exchange is streaming; every_ms must be positive.
  bool KeepStreamAlive(int64_t every_ms, std::string data, std::function<bool()> alive);

  // Runs `on_cancel` once when the client goes away before the response is complete (it closed
  // the connection, reads too slowly, or the server stopped), on the server's I/O thread; or at
  // once on this thread if that already happened. It must not block. Replaces an earlier one.
  void OnCancel(std::function<void()> on_cancel);
  bool cancelled() const;

  // Called by the connection (I/O thread): the client is gone / `bytes` of a chunk were written.
  void Cancel();
  void Written(size_t bytes);

 private:
  enum class State { kNew, kStreaming, kDone };
  bool Post(std::function<void(internal::Connection&)> op);

  const std::shared_ptr<internal::ServerCore> core_;
  const std::weak_ptr<internal::Connection> connection_;
  const HttpRequest request_;
  const size_t max_pending_write_bytes_;
  const size_t body_charge_;
  mutable Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

// Called on a handler thread for every request. It may answer at once or keep the exchange.
using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;
// Whether a request is handled on the server's I/O thread instead (its handler answers at once
// and never blocks: /health and /metrics, which then answer in milliseconds however long the
// handler threads are busy).
using InlinePredicate = std::function<bool(const HttpRequest&)>;

class HttpServer {
 public:
  virtual ~HttpServer() = default;
  // The bound port (the real one when options.port was 0) and "HOST:PORT".
  virtual uint16_t port() const = 0;
  virtual std::string address() const = 0;
  // Idempotent; the destructor calls it. Not from a handler or an OnCancel callback (it joins
  // the threads they run on).
  virtual void Stop() = 0;

  struct Stats {
    int64_t open_connections = 0;
    int64_t accepted_connections = 0;
    int64_t refused_connections = 0;  // over max_connections
    int64_t evicted_connections = 0;  // slow or idle ones closed for a new one at the limit
    int64_t refused_bodies = 0;       // 503s for max_body_bytes_in_flight
    int64_t requests = 0;             // handed to the handler
    int64_t cancelled = 0;            // exchanges cancelled before their response was complete
  };
  virtual Stats stats() const = 0;
};

// Binds options.host:options.port and starts serving. Unavailable when the address cannot be
// bound (naming it), InvalidArgument for bad options.
absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpServer(const HttpServerOptions& options,
                                                            HttpHandler handler,
                                                            InlinePredicate run_inline = nullptr);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_HTTP_SERVER_H_
