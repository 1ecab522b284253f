#include "connex/transport/internal/connection_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "connex/base/logging.h"

namespace connex::transport::internal {

ConnectionServer::ConnectionServer(std::string name, Fd listen, Handler handler)
    : name_(std::move(name)), listen_(std::move(listen)), handler_(std::move(handler)) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

ConnectionServer::~ConnectionServer() { Stop(); }

void ConnectionServer::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  shutdown(listen_.get(), SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Conn> conns;
  {
    MutexLock lock(&mu_);
    for (Conn& c : conns_) {
      if (!c.done) shutdown(c.fd, SHUT_RDWR);  // fd is closed only under mu_, after done
    }
    conns.splice(conns.end(), conns_);  // no new ones: the acceptor is gone
  }
  for (Conn& c : conns) c.thread.join();
}

void ConnectionServer::AcceptLoop() {
  while (true) {
    int fd = accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    int error = errno;
    MutexLock lock(&mu_);
    if (stopping_) {
      if (fd >= 0) close(fd);
      return;
    }
    if (fd < 0) {
      if (error == EINTR || error == ECONNABORTED) continue;
      CONNEX_LOG_ERROR("{}: accept: {}", name_, std::strerror(error));
      return;
    }
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->done) {
        it->thread.join();
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    Conn* c = &conns_.emplace_back();
    c->fd = fd;
    c->thread = std::thread([this, c] { Serve(c); });
  }
}

void ConnectionServer::Serve(Conn* c) {
  handler_(c->fd);
  MutexLock lock(&mu_);
  close(c->fd);
  c->done = true;
}

}  // namespace connex::transport::internal
