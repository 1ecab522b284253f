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

  Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  boost::asio::io_context* const io;
  std::atomic<int64_t> cancelled{0};
};

class ConnectionHandle;

// What a connection uses of its server; the server outlives its connections.
struct ConnectionContext {
  const HttpServerOptions& options;
  const HttpHandler& handler;
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
};

std::shared_ptr<ConnectionHandle> NewConnection(ConnectionContext context,
                                                boost::asio::ip::tcp::socket socket);

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_HTTP_CONNECTION_H_
