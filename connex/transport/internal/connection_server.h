// The owner side of the socket backends: accepts connections on a listening socket and serves
// each on a thread of its own. Thread-safe.
#ifndef CONNEX_TRANSPORT_INTERNAL_CONNECTION_SERVER_H_
#define CONNEX_TRANSPORT_INTERNAL_CONNECTION_SERVER_H_

#include <functional>
#include <list>
#include <string>
#include <thread>

#include "connex/base/mutex.h"
#include "connex/transport/internal/socket.h"

namespace connex::transport::internal {

class ConnectionServer {
 public:
  // Serves one accepted connection until it returns; the server closes `fd` afterwards.
  using Handler = std::function<void(int fd)>;

  // Starts accepting on `listen` (already listening). `name` prefixes log lines.
  ConnectionServer(std::string name, Fd listen, Handler handler);
  // Stop().
  ~ConnectionServer();

  // Stops accepting, shuts every open connection down (its handler's next receive fails) and
  // joins all threads. Idempotent; handlers must not call it.
  void Stop();

 private:
  struct Conn {
    int fd = -1;
    bool done = false;  // handler returned and fd is closed
    std::thread thread;
  };

  void AcceptLoop();
  void Serve(Conn* c);

  const std::string name_;
  Fd listen_;
  const Handler handler_;
  std::thread acceptor_;
  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A list for stable addresses; threads of finished connections are joined and erased by the
  // acceptor on its next accept, the rest by Stop().
  std::list<Conn> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace connex::transport::internal

#endif  // CONNEX_TRANSPORT_INTERNAL_CONNECTION_SERVER_H_
