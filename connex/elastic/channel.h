// A simple acknowledged message channel over ZeroMQ, addressed as `zmq+tcp://HOST:PORT`: a
// MessageInbox receives, SendMessage delivers one message and waits for its acknowledgement. It
// is what ElasticPeerSet::Send uses; the step protocol (connex/pp) has its own signals.
// MessageInbox is thread-safe; its loop thread owns the socket.
#ifndef CONNEX_ELASTIC_CHANNEL_H_
#define CONNEX_ELASTIC_CHANNEL_H_

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "connex/base/mutex.h"
#include "zmq.hpp"

namespace connex::elastic {

inline constexpr std::string_view kMessageScheme = "zmq+tcp://";
// Largest message the channel carries.
inline constexpr int64_t kMaxMessageBytes = 64 << 20;

class MessageInbox {
 public:
  // Binds on `host` at a free port.
  static absl::StatusOr<std::unique_ptr<MessageInbox>> Start(std::string host = "127.0.0.1");
  ~MessageInbox();

  // `zmq+tcp://HOST:PORT`, what the endpoint publishes in the directory.
  const std::string& address() const { return address_; }

  // The next message, or nullopt after `timeout_ms`.
  std::optional<std::string> Receive(int64_t timeout_ms);

  // Closes the socket: senders get no acknowledgement any more, as from a dead process.
  void Stop();

 private:
  MessageInbox() : context_(1) {}
  void Run();

  zmq::context_t context_;
  zmq::socket_t socket_;  // loop thread
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  connex::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
};

// Sends `bytes` to the inbox at `address` and waits up to `timeout_ms` for its acknowledgement.
// Unavailable: no acknowledgement (the peer is gone or unreachable). InvalidArgument: the address
// is not `zmq+tcp://HOST:PORT` or the message is too large.
absl::Status SendMessage(zmq::context_t& context, std::string_view address, std::string_view bytes,
                         int64_t timeout_ms);

}  // namespace connex::elastic

#endif  // CONNEX_ELASTIC_CHANNEL_H_
