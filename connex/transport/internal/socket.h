// Stream-socket plumbing shared by the tcp, shm and ucx backends: listening and connecting
// with timeouts, the 32-byte frame of the transport wire format (docs/design/transport.md), the
// LID handshake, busy-poll-then-block receives, and fd passing. Thread-safe (stateless); a
// socket is used by one thread at a time.
#ifndef CONNEX_TRANSPORT_INTERNAL_SOCKET_H_
#define CONNEX_TRANSPORT_INTERNAL_SOCKET_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "connex/base/lid.h"

namespace connex::transport::internal {

// Closes the fd on destruction. Movable.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

constexpr uint32_t kFrameMagic = 0x31584e43;  // "CNX1" little-endian
constexpr uint16_t kWireVersion = 1;
constexpr uint32_t kMaxFramePayload = 1 << 20;  // for control payloads (LIDs, errors, rkeys)

enum class FrameType : uint16_t {
  kHello = 1,     // a = channel kind, payload = sender's LID
  kHelloAck = 2,  // payload = server's LID
  kRead = 3,      // a = remote address, b = length
  kData = 4,      // b = length, followed by b bytes
  kError = 5,     // code = absl::StatusCode, payload = message
  kPing = 6,
  kPong = 7,
  kSegment = 8,      // shm: a = segment id; reply kSegmentFd (fd passed with it) or kError
  kSegmentFd = 9,    // shm: a = segment id, b = segment length
  kRkey = 10,        // ucx: a = address, b = length; reply kRkeyInfo or kError
  kRkeyInfo = 11,    // ucx: a = region base, b = region length, payload = packed rkey
  kInvalidate = 12,  // ucx: a = region base, unregistered (reply kInvalidateAck)
  kInvalidateAck = 13,
  kWorkerAddress = 14,      // ucx: reply kWorkerAddressInfo
  kWorkerAddressInfo = 15,  // ucx: payload = the UCP worker address
};

enum class ChannelKind : uint64_t { kData = 0, kControl = 1 };

// Host byte order (the transports run between little-endian x86-64/aarch64 hosts).
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t type = 0;
  uint16_t version = kWireVersion;
  uint32_t code = 0;
  uint32_t payload = 0;  // bytes of payload after the header (control frames)
  uint64_t a = 0;
  uint64_t b = 0;
};
static_assert(sizeof(FrameHeader) == 32);

inline FrameHeader MakeFrame(FrameType type, uint64_t a = 0, uint64_t b = 0) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.a = a;
  h.b = b;
  return h;
}

// Called while a receive waits; a non-OK status aborts it (e.g. the peer is suspected).
using AbortCheck = std::function<absl::Status()>;

// Listens on host:port (0 = any) and returns the socket and the bound port.
absl::StatusOr<Fd> ListenTcp(const std::string& host, uint16_t port, uint16_t* bound_port);
absl::StatusOr<Fd> ListenUnix(const std::string& path);
// Connects within `timeout_ms`. Unavailable names the address on failure.
absl::StatusOr<Fd> ConnectTcp(const std::string& host, uint16_t port, int timeout_ms);
absl::StatusOr<Fd> ConnectUnix(const std::string& path, int timeout_ms);
// TCP_NODELAY; socket buffers of `buffer_bytes` each way when > 0.
void TuneTcp(int fd, int buffer_bytes);

// Sends all of iov (MSG_NOSIGNAL); blocking socket assumed. Unavailable on error.
absl::Status SendAll(int fd, struct iovec* iov, int iovcnt);
absl::Status SendFrame(int fd, const FrameHeader& h, std::string_view payload = {});

// Receives exactly `length` bytes into `buf`: busy-polls for `spin_us` after each wait, then
// blocks in poll() in slices of `slice_ms`, calling `abort` between slices. Unavailable on EOF
// or error; `abort`'s status when it fails.
absl::Status RecvAll(int fd, void* buf, size_t length, int spin_us, int slice_ms,
                     const AbortCheck& abort);
// Receives a header and checks magic/version; its payload (at most kMaxFramePayload) into
// `payload` when non-null, else the payload must be empty.
absl::Status RecvFrame(int fd, FrameHeader* h, std::string* payload, int spin_us, int slice_ms,
                       const AbortCheck& abort);

// The client side of the handshake: sends HELLO(kind, self), expects HELLO_ACK naming
// `expected`. FailedPrecondition when the server is another LID.
absl::Status ClientHandshake(int fd, ChannelKind kind, const Lid& self, const Lid& expected,
                             int timeout_ms);
// The server side: receives HELLO within `timeout_ms`, replies with `self`. Returns the kind
// and the client's LID text.
absl::StatusOr<ChannelKind> ServerHandshake(int fd, const Lid& self, int timeout_ms,
                                            std::string* client_lid);

// Sends one fd with a frame (SCM_RIGHTS) over a unix-domain socket; receives it.
absl::Status SendFrameWithFd(int sock, const FrameHeader& h, int fd);
absl::Status RecvFrameWithFd(int sock, FrameHeader* h, Fd* fd, int timeout_ms);

// An error frame carrying `status`; the inverse.
absl::Status SendError(int fd, const absl::Status& status);
absl::Status StatusFromErrorFrame(const FrameHeader& h, std::string_view payload);

int64_t NowUs();

}  // namespace connex::transport::internal

#endif  // CONNEX_TRANSPORT_INTERNAL_SOCKET_H_
