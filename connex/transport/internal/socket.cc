#include "connex/transport/internal/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "connex/base/curve.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::transport::internal {
namespace {

std::string Errno() { return std::strerror(errno); }

absl::StatusOr<sockaddr_in> Resolve(const std::string& host, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    return absl::UnavailableError(StrCat("cannot resolve host '", host, "'"));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return addr;
}

absl::StatusOr<sockaddr_un> UnixAddr(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(StrCat("unix socket path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// Connects non-blocking, waits up to timeout_ms, returns a blocking socket.
absl::StatusOr<Fd> ConnectAddr(int family, const sockaddr* addr, socklen_t len,
                               const std::string& name, int timeout_ms) {
  Fd fd(socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return absl::UnavailableError(StrCat("socket: ", Errno()));
  if (connect(fd.get(), addr, len) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) {
      return absl::UnavailableError(StrCat("connect to ", name, ": ", Errno()));
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int r = poll(&p, 1, timeout_ms);
    if (r == 0) return absl::UnavailableError(StrCat("connect to ", name, ": timed out"));
    int err = 0;
    socklen_t elen = sizeof(err);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
    if (r < 0 || err != 0) {
      return absl::UnavailableError(
          StrCat("connect to ", name, ": ", std::strerror(err != 0 ? err : errno)));
    }
  }
  int flags = fcntl(fd.get(), F_GETFL);
  fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::StatusOr<Fd> ListenTcp(const std::string& host, uint16_t port, uint16_t* bound_port) {
  // The data plane authenticates nobody (a reader that knows a region reads it): beyond loopback
  // only when told so.
  CONNEX_RETURN_IF_ERROR(CheckListenExposure("data plane", host, /*authenticated=*/false));
  CONNEX_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host, port));
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::UnavailableError(StrCat("socket: ", Errno()));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd.get(), 512) != 0) {
    return absl::UnavailableError(StrCat("listen on ", host, ":", port, ": ", Errno()));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  if (bound_port != nullptr) *bound_port = ntohs(addr.sin_port);
  return fd;
}

absl::StatusOr<Fd> ListenUnix(const std::string& path) {
  CONNEX_ASSIGN_OR_RETURN(sockaddr_un addr, UnixAddr(path));
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::UnavailableError(StrCat("socket: ", Errno()));
  unlink(path.c_str());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd.get(), 512) != 0) {
    return absl::UnavailableError(StrCat("listen on unix socket ", path, ": ", Errno()));
  }
  return fd;
}

absl::StatusOr<Fd> ConnectTcp(const std::string& host, uint16_t port, int timeout_ms) {
  CONNEX_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host, port));
  return ConnectAddr(AF_INET, reinterpret_cast<sockaddr*>(&addr), sizeof(addr),
                     StrCat(host, ":", port), timeout_ms);
}

absl::StatusOr<Fd> ConnectUnix(const std::string& path, int timeout_ms) {
  CONNEX_ASSIGN_OR_RETURN(sockaddr_un addr, UnixAddr(path));
  return ConnectAddr(AF_UNIX, reinterpret_cast<sockaddr*>(&addr), sizeof(addr), path, timeout_ms);
}

void TuneTcp(int fd, int buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

absl::Status SendAll(int fd, struct iovec* iov, int iovcnt) {
  while (iovcnt > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = iovcnt;
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::UnavailableError("send timed out (peer not reading)");
      }
      return absl::UnavailableError(StrCat("send: ", Errno()));
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status SendFrame(int fd, const FrameHeader& h, std::string_view payload) {
  FrameHeader copy = h;
  copy.payload = static_cast<uint32_t>(payload.size());
  iovec iov[2] = {{&copy, sizeof(copy)}, {const_cast<char*>(payload.data()), payload.size()}};
  return SendAll(fd, iov, payload.empty() ? 1 : 2);
}

absl::Status RecvAll(int fd, void* buf, size_t length, int spin_us, int slice_ms,
                     const AbortCheck& abort) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < length) {
    ssize_t n = recv(fd, p + got, length - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(StrCat("recv: ", Errno()));
    }
    // Nothing there: busy-poll a little (a wake-up costs tens of µs here), then block.
    int64_t spin_until = NowUs() + spin_us;
    bool ready = false;
    while (NowUs() < spin_until) {
      char c;
      ssize_t peek = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
      if (peek != 0 && !(peek < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
        ready = true;
        break;
      }
      if (peek == 0) return absl::UnavailableError("connection closed by peer");
    }
    while (!ready) {
      pollfd pfd{fd, POLLIN, 0};
      int r = poll(&pfd, 1, slice_ms);
      if (r > 0) break;
      if (r < 0 && errno != EINTR) return absl::UnavailableError(StrCat("poll: ", Errno()));
      if (abort) CONNEX_RETURN_IF_ERROR(abort());
    }
  }
  return absl::OkStatus();
}

absl::Status RecvFrame(int fd, FrameHeader* h, std::string* payload, int spin_us, int slice_ms,
                       const AbortCheck& abort) {
  CONNEX_RETURN_IF_ERROR(RecvAll(fd, h, sizeof(*h), spin_us, slice_ms, abort));
  if (h->magic != kFrameMagic || h->version != kWireVersion) {
    return absl::UnavailableError(
        StrCat("malformed frame (magic ", h->magic, ", version ", h->version, ")"));
  }
  if (h->payload > kMaxFramePayload) {
    return absl::UnavailableError(StrCat("frame payload of ", h->payload, " bytes is too big"));
  }
  if (h->payload > 0) {
    std::string local;
    std::string* out = payload != nullptr ? payload : &local;
    out->resize(h->payload);
    CONNEX_RETURN_IF_ERROR(RecvAll(fd, out->data(), h->payload, spin_us, slice_ms, abort));
  } else if (payload != nullptr) {
    payload->clear();
  }
  return absl::OkStatus();
}

absl::Status SendError(int fd, const absl::Status& status) {
  FrameHeader h = MakeFrame(FrameType::kError);
  h.code = static_cast<uint32_t>(status.code());
  std::string_view msg(status.message().data(), status.message().size());
  if (msg.size() > 4096) msg = msg.substr(0, 4096);
  return SendFrame(fd, h, msg);
}

absl::Status StatusFromErrorFrame(const FrameHeader& h, std::string_view payload) {
  auto code = static_cast<absl::StatusCode>(h.code);
  if (h.code == 0 || h.code > 16) code = absl::StatusCode::kUnknown;
  return absl::Status(code, AsAbsl(payload));
}

absl::Status ClientHandshake(int fd, ChannelKind kind, const Lid& self, const Lid& expected,
                             int timeout_ms) {
  CONNEX_RETURN_IF_ERROR(
      SendFrame(fd, MakeFrame(FrameType::kHello, static_cast<uint64_t>(kind)), self.ToString()));
  int64_t deadline = NowUs() + int64_t{timeout_ms} * 1000;
  AbortCheck abort = [deadline]() {
    return NowUs() > deadline ? absl::UnavailableError("handshake timed out") : absl::OkStatus();
  };
  FrameHeader h;
  std::string payload;
  CONNEX_RETURN_IF_ERROR(RecvFrame(fd, &h, &payload, 0, 10, abort));
  if (h.type == static_cast<uint16_t>(FrameType::kError)) {
    return StatusFromErrorFrame(h, payload);
  }
  if (h.type != static_cast<uint16_t>(FrameType::kHelloAck)) {
    return absl::UnavailableError(StrCat("handshake: unexpected frame type ", h.type));
  }
  if (payload != expected.ToString()) {
    return absl::FailedPreconditionError(
        StrCat("address is now ", payload, ", not ", expected.ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChannelKind> ServerHandshake(int fd, const Lid& self, int timeout_ms,
                                            std::string* client_lid) {
  int64_t deadline = NowUs() + int64_t{timeout_ms} * 1000;
  AbortCheck abort = [deadline]() {
    return NowUs() > deadline ? absl::UnavailableError("handshake timed out") : absl::OkStatus();
  };
  FrameHeader h;
  CONNEX_RETURN_IF_ERROR(RecvFrame(fd, &h, client_lid, 0, 10, abort));
  if (h.type != static_cast<uint16_t>(FrameType::kHello) || h.a > 1) {
    return absl::UnavailableError(StrCat("handshake: expected HELLO, got type ", h.type));
  }
  CONNEX_RETURN_IF_ERROR(SendFrame(fd, MakeFrame(FrameType::kHelloAck), self.ToString()));
  return static_cast<ChannelKind>(h.a);
}

absl::Status SendFrameWithFd(int sock, const FrameHeader& h, int fd) {
  FrameHeader copy = h;
  copy.payload = 0;
  iovec iov{&copy, sizeof(copy)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  while (true) {
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(copy))) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    return absl::UnavailableError(StrCat("sendmsg(fd): ", n < 0 ? Errno() : "short write"));
  }
}

absl::Status RecvFrameWithFd(int sock, FrameHeader* h, Fd* fd, int timeout_ms) {
  pollfd p{sock, POLLIN, 0};
  int r = poll(&p, 1, timeout_ms);
  if (r <= 0) return absl::UnavailableError("timed out waiting for a segment fd");
  iovec iov{h, sizeof(*h)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  if (n == 0) return absl::UnavailableError("connection closed by peer");
  if (n != static_cast<ssize_t>(sizeof(*h))) {
    return absl::UnavailableError(StrCat("recvmsg(fd): ", n < 0 ? Errno() : "short read"));
  }
  if (h->magic != kFrameMagic) return absl::UnavailableError("malformed frame");
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c != nullptr && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
    int received = -1;
    std::memcpy(&received, CMSG_DATA(c), sizeof(int));
    fd->reset(received);
  }
  return absl::OkStatus();
}

}  // namespace connex::transport::internal
