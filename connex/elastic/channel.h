// Acknowledged message channels over ZeroMQ, addressed as `zmq+tcp://HOST:PORT`, with CURVE
// `zmq+tcp://HOST:PORT?curve=HEX` (the inbox's public key, so that a sender learns it from the
// directory with the address; connex/base/curve.h): a MessageInbox
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
#include "connex/base/curve.h"
#include "connex/base/curve_zmq.h"
#include "connex/base/lid.h"
#include "connex/base/mutex.h"
#include "zmq.hpp"

namespace connex::elastic {

inline constexpr std::string_view kMessageScheme = "zmq+tcp://";
// Largest message the channel carries.
inline constexpr int64_t kMaxMessageBytes = 64 << 20;
// Bytes an inbox holds that Receive has not taken; beyond, it acknowledges nothing more (the
// sender's Send fails as for a dead peer) until the receiver catches up.
inline constexpr size_t kMaxInboxBytes = 256 << 20;

class MessageInbox {
 public:
  // Binds on `host` at a free port. With a CURVE key pair the inbox is a CURVE server that admits
  // the authorized keys only; without one, a non-loopback `host` is refused (InvalidArgument)
  // unless CONNEX_INSECURE=1.
  static absl::StatusOr<std::unique_ptr<MessageInbox>> Start(std::string host = "127.0.0.1",
                                                             CurveSettings curve = {});
  ~MessageInbox();

  // `zmq+tcp://HOST:PORT` (with CURVE `...?curve=HEX`), what the endpoint publishes in the
  // directory.
  const std::string& address() const { return address_; }
  // Connections refused by CURVE, and messages refused because the inbox was full.
  uint64_t connections_refused() const { return zap_ ? zap_->refused() : 0; }
  uint64_t messages_refused() const { return messages_refused_.load(); }

  // The next message, or nullopt after `timeout_ms`.
  std::optional<std::string> Receive(int64_t timeout_ms);

  // Closes the socket: senders get no acknowledgement any more, as from a dead process.
  void Stop();

 private:
  MessageInbox() : context_(1) {}
  void Run();

  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;  // with CURVE: decides which client keys get in
  zmq::socket_t socket_;             // loop thread
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> messages_refused_{0};
  connex::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// A channel is named by the peer incarnation it talks to: epochs never repeat, so a closed
// channel's key is never reused by another process.
using ChannelKey = std::pair<Lid, uint64_t>;

struct MessageChannelsOptions {
  // Messages queued per channel before Send fails fast (Unavailable) instead of queueing more.
  int send_queue = 1000;
  // Closed channels remembered, so that a Send racing with Close fails instead of reopening.
  size_t max_closed = 1024;
  // With a key pair, channels are CURVE clients of inboxes whose address carries their key
  // (`?curve=HEX`); a Send between a CURVE side and a plain one fails (FailedPrecondition).
  CurveSettings curve = {};
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
  // `zmq+tcp://HOST:PORT[?curve=HEX]` or the message is too large. FailedPrecondition: one side
  // uses CURVE and the other does not.
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
    std::string endpoint;    // tcp://HOST:PORT
    std::string server_key;  // the inbox's CURVE public key (Z85); empty without CURVE
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
                         int64_t timeout_ms, const CurveSettings& curve = {});

}  // namespace connex::elastic

#endif  // CONNEX_ELASTIC_CHANNEL_H_
