#include "connex/transport/internal/connection_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "connex/base/wait.h"
#include "gtest/gtest.h"

namespace connex::transport::internal {
namespace {

// A handler that echoes bytes until the client closes or the server shuts the connection down.
void Echo(int fd, std::atomic<int>* active, std::atomic<int>* served) {
  active->fetch_add(1);
  char buf[64];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    if (send(fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
  }
  active->fetch_sub(1);
  served->fetch_add(1);
}

TEST(ConnectionServerTest, ServesEachConnectionOnItsOwnThreadAndStopsOpenOnes) {
  uint16_t port = 0;
  absl::StatusOr<Fd> listen = ListenTcp("127.0.0.1", 0, &port);
  ASSERT_TRUE(listen.ok()) << listen.status();
  std::atomic<int> active{0}, served{0};
  ConnectionServer server("test", std::move(*listen), [&](int fd) { Echo(fd, &active, &served); });

  // Several clients at once, each answered independently.
  std::vector<Fd> clients;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Fd> c = ConnectTcp("127.0.0.1", port, 2000);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  for (size_t i = 0; i < clients.size(); ++i) {
    char out = static_cast<char>('a' + i), in = 0;
    ASSERT_EQ(send(clients[i].get(), &out, 1, MSG_NOSIGNAL), 1);
    ASSERT_EQ(recv(clients[i].get(), &in, 1, MSG_WAITALL), 1);
    EXPECT_EQ(in, out);
  }
  EXPECT_TRUE(WaitUntil([&] { return active.load() == 4; }, 5000));

  // A client that leaves ends its handler; the server reaps it on the next accept.
  clients.pop_back();
  EXPECT_TRUE(WaitUntil([&] { return served.load() == 1; }, 5000));
  absl::StatusOr<Fd> late = ConnectTcp("127.0.0.1", port, 2000);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(WaitUntil([&] { return active.load() == 4; }, 5000));

  // Stop shuts the open connections down and joins their handlers, though no client closed.
  server.Stop();
  EXPECT_EQ(active.load(), 0);
  EXPECT_EQ(served.load(), 5);
  server.Stop();  // idempotent
  // Nothing serves any more: a new client is refused, or at least never answered.
  absl::StatusOr<Fd> after = ConnectTcp("127.0.0.1", port, 500);
  if (after.ok()) {
    char byte = 'x';
    send(after->get(), &byte, 1, MSG_NOSIGNAL);
    pollfd p{after->get(), POLLIN, 0};
    if (poll(&p, 1, 300) == 1) {
      EXPECT_LE(recv(after->get(), &byte, 1, 0), 0);
    }
  }
  EXPECT_EQ(served.load(), 5);
}

}  // namespace
}  // namespace connex::transport::internal
