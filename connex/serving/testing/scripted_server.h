// A scripted HTTP server of one connection, for clients' failure tests: it reads the request's
// head, sends a fixed reply (which may be nothing, or not HTTP), then holds the connection open,
// saying nothing more, until it is destroyed — or closes it at once. Thread-safe.
#ifndef CONNEX_SERVING_TESTING_SCRIPTED_SERVER_H_
#define CONNEX_SERVING_TESTING_SCRIPTED_SERVER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <future>
#include <string>
#include <thread>
#include <utility>

#include "gtest/gtest.h"

namespace connex::serving::testing {

// On 127.0.0.1, a port of its own (port()).
class ScriptedServer {
 public:
  explicit ScriptedServer(std::string reply, bool close_after_reply = false) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
    EXPECT_EQ(::listen(listen_fd_, 1), 0);
    socklen_t size = sizeof at;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&at), &size);
    port_ = ntohs(at.sin_port);
    thread_ = std::thread([this, reply = std::move(reply), close_after_reply] {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        request.append(buffer, static_cast<size_t>(n));
      }
      ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
      if (!close_after_reply) release_.get_future().wait();
      ::close(fd);
    });
  }
  ~ScriptedServer() {
    release_.set_value();
    ::shutdown(listen_fd_, SHUT_RDWR);  // an accept still waiting returns
    thread_.join();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }

 private:
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::promise<void> release_;
  std::thread thread_;
};

}  // namespace connex::serving::testing

#endif  // CONNEX_SERVING_TESTING_SCRIPTED_SERVER_H_
