// Acknowledged message channels over ZeroMQ, addressed as `zmq+tcp://HOST:PORT`: a MessageInbox
// receives and acknowledges; MessageChannels keeps one persistent connection per peer incarnation
// and sends over it; SendMessage is a one-shot send for tools. ElasticPeerSet::Send uses
// MessageChannels; the step protocol (connex/pp) has its own signals.
//
// MessageInbox and MessageChannels are thread-safe; each one's I/O thread owns its sockets.
#ifndef CONNEX_ELASTIC_CHANNEL_H_
#define CONNEX_ELASTIC_CHANNEL_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
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

// A channel is named by the peer incarnation it talks to: epochs never repeat, so a closed
// channel's key is never reused by another process.
using ChannelKey = std::pair<Lid, uint64_t>;

struct MessageChannelsOptions {
  // Messages queued per channel before Send fails fast (Unavailable) instead of queueing more.
  int send_queue = 1000;
  // Closed channels remembered, so that a Send racing with Close fails instead of reopening.
  size_t max_closed = 1024;
};

// Persistent acknowledged channels: one DEALER per peer incarnation, opened at the first Send
// and reused by every later one, owned by one I/O thread (ZeroMQ sockets belong to one thread;
// callers hand messages over through a queue). Every message carries an id that the inbox
// echoes in its acknowledgement.
class MessageChannels {
 public:
  static absl::StatusOr<std::unique_ptr<MessageChannels>> Start(
      MessageChannelsOptions options = {});
  // Fails pending sends (Cancelled) and closes every socket.
  ~MessageChannels();

  MessageChannels(const MessageChannels&) = delete;
  MessageChannels& operator=(const MessageChannels&) = delete;

  // Sends `bytes` to the inbox at `address` over channel `key` and blocks up to `timeout_ms`
  // for its acknowledgement. Unavailable: no acknowledgement in time, the send queue is full, or
  // the channel was closed (the message is Close's reason). InvalidArgument: the address is not
  // `zmq+tcp://HOST:PORT` or the message is too large.
  absl::Status Send(const ChannelKey& key, std::string_view address, std::string_view bytes,
                    int64_t timeout_ms);

  // Closes channel `key` for good: its pending sends fail at once with `reason` (Unavailable),
  // later sends on it fail the same way.
  void Close(const ChannelKey& key, std::string reason);
  // Closes channel `key` once it has no send waiting for an acknowledgement (a peer that LEFT
  // acknowledges what it was sent); later sends on it fail with `reason`.
  void CloseWhenIdle(const ChannelKey& key, std::string reason);

  // Channels with an open socket, and sockets opened so far (reuse shows as opened() == 1).
  size_t open_channels() const;
  uint64_t opened() const;

 private:
  struct Outgoing {
    ChannelKey key;
    std::string endpoint;  // tcp://HOST:PORT
    uint64_t id;
    std::string bytes;
  };
  struct Pending {
    ChannelKey key;
    std::optional<absl::Status> result;
  };
  struct Channel {
    zmq::socket_t socket;
    std::string endpoint;
  };

  explicit MessageChannels(MessageChannelsOptions options) : options_(options), context_(1) {}
  void Run();
  void Wake();
  void RememberClosedLocked(const ChannelKey& key, std::string reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailPendingLocked(const ChannelKey& key, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MessageChannelsOptions options_;
  zmq::context_t context_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::map<ChannelKey, Channel> channels_;  // I/O thread

  mutable connex::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Outgoing> outbox_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Closed channels and why; the I/O thread closes their sockets.
  std::map<ChannelKey, std::string> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<ChannelKey> closed_order_ ABSL_GUARDED_BY(mu_);
  std::deque<ChannelKey> to_close_ ABSL_GUARDED_BY(mu_);
  // Channels to close once idle, and the reason.
  std::map<ChannelKey, std::string> closing_ ABSL_GUARDED_BY(mu_);
  size_t open_channels_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t opened_ ABSL_GUARDED_BY(mu_) = 0;
};

// Sends `bytes` to the inbox at `address` on a connection of its own and waits up to
// `timeout_ms` for its acknowledgement (for tools; senders of many messages use
// MessageChannels). Unavailable: no acknowledgement. InvalidArgument: as MessageChannels::Send.
absl::Status SendMessage(zmq::context_t& context, std::string_view address, std::string_view bytes,
                         int64_t timeout_ms);

}  // namespace connex::elastic

#endif  // CONNEX_ELASTIC_CHANNEL_H_
