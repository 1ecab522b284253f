// The connection side of HttpServer (http_server.h): one client connection's state machine
// (read a request under its bounds, hand it to the handler, write the whole or streamed response,
// notice the client leaving, linger-close) and what exchanges share with the server. Used by
// http_server.cc only. Connections are confined to the server's I/O thread; ServerCore is
// thread-safe.
#ifndef CONNEX_SERVING_INTERNAL_HTTP_CONNECTION_H_
#define CONNEX_SERVING_INTERNAL_HTTP_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include "absl/base/thread_annotations.h"
#include "boost/asio.hpp"
#include "connex/base/mutex.h"
#include "connex/serving/http_server.h"

namespace connex::serving::internal {

// How long a connection that is being closed keeps reading (and discarding) what its client
// still sends, so that the client reads our last response instead of a reset.
inline constexpr int64_t kMaxLingerMs = 1000;
// At the connection limit, a connection that has waited at least this long for its request's
// bytes may be closed to make room for a new one (HttpServerOptions::max_connections).
inline constexpr int64_t kMinWaitBeforeEvictionMs = 500;
// After the bodies held reach this much, the heap is given back to the system once they are all
// released (glibc keeps freed memory otherwise: 500 held 1 MiB bodies kept 500 MB).
inline constexpr int64_t kTrimAfterBodyBytes = 16 << 20;

int64_t SteadyNowMs();

// What exchanges share with the server: the I/O context to post to, as long as it exists.
struct ServerCore {
  explicit ServerCore(boost::asio::io_context* io_context) : io(io_context) {}

  // Runs `fn` on the I/O thread; false once the server has stopped.
  bool Post(std::function<void()> fn) {
    MutexLock lock(&mu);
    if (stopped) return false;
    boost::asio::post(*io, std::move(fn));
    return true;
  }

  // Charges `bytes` of request bodies against `limit`; false (nothing charged) past it.
  bool ChargeBody(size_t bytes, size_t limit);
  // Releases a charge; gives the heap back once every body is released after a high mark.
  void ReleaseBody(size_t bytes);

  Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  boost::asio::io_context* const io;
  std::atomic<int64_t> cancelled{0};
  std::atomic<int64_t> body_bytes{0};  // request bodies held now
  std::atomic<bool> trim_due{false};   // body_bytes passed kTrimAfterBodyBytes since the last trim
  std::atomic<int64_t> refused_bodies{0};
};

class ConnectionHandle;

// What a connection uses of its server; the server outlives its connections.
struct ConnectionContext {
  const HttpServerOptions& options;
  const HttpHandler& handler;
  const InlinePredicate& run_inline;  // may be empty
  std::shared_ptr<ServerCore> core;
  boost::asio::thread_pool& pool;  // runs the handler
  std::atomic<int64_t>& requests;  // counts requests handed to the handler
  std::function<bool()> stopping;
  std::function<void(ConnectionHandle*)> forget;  // from the connection's destructor
};

// What the server does with a connection, on the I/O thread.
class ConnectionHandle {
 public:
  virtual ~ConnectionHandle() = default;
  // Serves requests until the client leaves or the connection is closed.
  virtual void Start() = 0;
  // Over the connection limit: a 503 without reading the request, then close.
  virtual void Refuse(int limit) = 0;
  // The server stops: close now if idle, else after the current response.
  virtual void OnStopping() = 0;
  // The server stops for good: cancel the request in flight, close.
  virtual void Abort() = 0;
  // Since when (SteadyNowMs) it waits for a request's bytes — a head or body under way, or the
  // next request on a kept-alive connection — or -1 while it handles or answers one.
  virtual int64_t WaitingSinceMs() const = 0;
  // At the connection limit, for a new connection: closes (a 408 if part of a request came).
  virtual void Evict() = 0;
};

std::shared_ptr<ConnectionHandle> NewConnection(ConnectionContext context,
                                                boost::asio::ip::tcp::socket socket);

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_HTTP_CONNECTION_H_
