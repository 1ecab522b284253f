#include "connex/elastic/channel.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"

namespace connex::elastic {
namespace {

// Wire (documented in docs/design/protocol.md): a sender's DEALER sends [id: 8 bytes][payload];
// the inbox answers [id]["ACK"].
constexpr std::string_view kAck = "ACK";
constexpr size_t kIdBytes = sizeof(uint64_t);

std::string EncodeId(uint64_t id) {
  std::string out(kIdBytes, '\0');
  for (size_t i = 0; i < kIdBytes; ++i) out[i] = static_cast<char>((id >> (8 * i)) & 0xff);
  return out;
}

std::optional<uint64_t> DecodeId(std::string_view bytes) {
  if (bytes.size() != kIdBytes) return std::nullopt;
  uint64_t id = 0;
  for (size_t i = 0; i < kIdBytes; ++i) id |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  return id;
}

constexpr std::string_view kCurveQuery = "?curve=";

struct Destination {
  std::string endpoint;    // tcp://HOST:PORT
  std::string server_key;  // Z85; empty without CURVE
};

// `zmq+tcp://HOST:PORT[?curve=HEX]` -> `tcp://HOST:PORT` and the inbox's key, checking the size
// and that both sides agree on CURVE.
absl::StatusOr<Destination> DestinationOf(std::string_view address, size_t bytes,
                                          const CurveSettings& curve) {
  if (address.substr(0, kMessageScheme.size()) != kMessageScheme) {
    return absl::InvalidArgumentError(
        StrCat("message address '", address, "' must look like zmq+tcp://HOST:PORT"));
  }
  if (static_cast<int64_t>(bytes) > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        StrCat("message of ", bytes, " bytes exceeds the limit of ", kMaxMessageBytes));
  }
  Destination d;
  d.endpoint = std::string(address.substr(4));  // drop "zmq+"
  if (size_t query = d.endpoint.find(kCurveQuery); query != std::string::npos) {
    absl::StatusOr<std::string> key =
        CurveKeyFromHex(std::string_view(d.endpoint).substr(query + kCurveQuery.size()));
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          StrCat("message address '", address, "': ", key.status().message()));
    }
    d.server_key = *std::move(key);
    d.endpoint.resize(query);
  }
  absl::Status endpoint_ok = ParseTcpEndpoint(d.endpoint).status();
  if (!endpoint_ok.ok()) return endpoint_ok;
  if (curve.enabled() && d.server_key.empty()) {
    return absl::FailedPreconditionError(
        StrCat(address, ": the inbox does not use CURVE and this sender does"));
  }
  if (!curve.enabled() && !d.server_key.empty()) {
    return absl::FailedPreconditionError(StrCat(
        address, ": the inbox uses CURVE and this sender has no key (CONNEX_CURVE_KEY_FILE)"));
  }
  return d;
}

}  // namespace

// ---- MessageInbox ----

absl::StatusOr<std::unique_ptr<MessageInbox>> MessageInbox::Start(std::string host,
                                                                  CurveSettings curve) {
  CONNEX_RETURN_IF_ERROR(CheckListenExposure("message inbox", host, curve.enabled()));
  std::unique_ptr<MessageInbox> inbox(new MessageInbox());
  if (curve.enabled()) {
    CONNEX_ASSIGN_OR_RETURN(inbox->zap_,
                            ZapHandler::Start(inbox->context_, curve.authorized, "message inbox"));
  }
  inbox->socket_ = zmq::socket_t(inbox->context_, zmq::socket_type::router);
  ConfigureZmqSocket(inbox->socket_, kMaxMessageBytes);
  MakeCurveServer(inbox->socket_, curve);
  absl::StatusOr<std::string> bound = BindZmq(inbox->socket_, StrCat("tcp://", host, ":0"));
  if (!bound.ok()) return bound.status();
  inbox->address_ = StrCat("zmq+", *bound);
  if (curve.enabled()) {
    inbox->address_ += StrCat(kCurveQuery, CurveKeyToHex(curve.keys->public_key));
  }
  inbox->thread_ = std::thread([p = inbox.get()] { p->Run(); });
  return inbox;
}

MessageInbox::~MessageInbox() { Stop(); }

void MessageInbox::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void MessageInbox::Run() {
  std::vector<zmq::message_t> parts;
  while (!stop_.load()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
    } catch (const zmq::error_t&) {
      continue;
    }
    while (true) {
      absl::StatusOr<bool> got = RecvMultipart(socket_, &parts);
      if (!got.ok() || !*got) break;
      if (parts.size() != 3 || parts[1].size() != kIdBytes)
        continue;  // not [identity][id][payload]
      {
        connex::MutexLock lock(&mu_);
        if (queued_bytes_ + parts[2].size() > kMaxInboxBytes) {
          // Not acknowledged: the sender fails as for a dead peer, and may try again.
          messages_refused_.fetch_add(1);
          continue;
        }
        queued_bytes_ += parts[2].size();
        queue_.emplace_back(AsView(parts[2]));
      }
      try {
        socket_.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        socket_.send(parts[1], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        socket_.send(zmq::buffer(kAck), zmq::send_flags::dontwait);
      } catch (const zmq::error_t&) {
      }
    }
  }
  socket_.close();
}

std::optional<std::string> MessageInbox::Receive(int64_t timeout_ms) {
  connex::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(timeout_ms))) {
    return std::nullopt;
  }
  std::string out = std::move(queue_.front());
  queue_.pop_front();
  queued_bytes_ -= out.size();
  return out;
}

// ---- MessageChannels ----

absl::StatusOr<std::unique_ptr<MessageChannels>> MessageChannels::Start(
    MessageChannelsOptions options) {
  std::unique_ptr<MessageChannels> channels(new MessageChannels(options));
  channels->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (channels->wake_fd_ < 0) {
    return absl::InternalError(StrCat("message channels: eventfd: ", std::strerror(errno)));
  }
  channels->thread_ = std::thread([p = channels.get()] { p->Run(); });
  return channels;
}

MessageChannels::~MessageChannels() {
  {
    connex::MutexLock lock(&mu_);
    stop_ = true;
    for (auto& [id, p] : pending_) {
      if (!p.result) p.result = absl::CancelledError("message channels: closed");
    }
  }
  Wake();
  if (thread_.joinable()) thread_.join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void MessageChannels::Wake() {
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;
}

absl::Status MessageChannels::Send(const ChannelKey& key, std::string_view address,
                                   std::string_view bytes, int64_t timeout_ms) {
  absl::StatusOr<Destination> to = DestinationOf(address, bytes.size(), options_.curve);
  if (!to.ok()) return to.status();
  uint64_t id = 0;
  {
    connex::MutexLock lock(&mu_);
    if (stop_) return absl::CancelledError("message channels: closed");
    auto closed = closed_.find(key);
    if (closed != closed_.end()) return absl::UnavailableError(closed->second);
    auto closing = closing_.find(key);
    if (closing != closing_.end()) return absl::UnavailableError(closing->second);
    id = next_id_++;
    pending_.emplace(id, Pending{key, std::nullopt});
    outbox_.push_back(
        Outgoing{key, std::move(to->endpoint), std::move(to->server_key), id, std::string(bytes)});
  }
  Wake();
  connex::MutexLock lock(&mu_);
  auto done = [this, id]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.at(id).result.has_value(); };
  mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(timeout_ms));
  auto it = pending_.find(id);
  absl::Status result = it->second.result
                            ? *it->second.result
                            : absl::UnavailableError(StrCat(address, ": no acknowledgement within ",
                                                            timeout_ms, " ms"));
  pending_.erase(it);
  return result;
}

void MessageChannels::Close(const ChannelKey& key, std::string reason) {
  {
    connex::MutexLock lock(&mu_);
    FailPendingLocked(key, absl::UnavailableError(reason));
    closing_.erase(key);
    RememberClosedLocked(key, std::move(reason));
    to_close_.push_back(key);
  }
  Wake();
}

void MessageChannels::CloseWhenIdle(const ChannelKey& key, std::string reason) {
  {
    connex::MutexLock lock(&mu_);
    if (closed_.count(key)) return;
    closing_[key] = std::move(reason);
  }
  Wake();
}

size_t MessageChannels::open_channels() const {
  connex::MutexLock lock(&mu_);
  return open_channels_;
}

uint64_t MessageChannels::opened() const {
  connex::MutexLock lock(&mu_);
  return opened_;
}

void MessageChannels::RememberClosedLocked(const ChannelKey& key, std::string reason) {
  if (closed_.insert_or_assign(key, std::move(reason)).second) closed_order_.push_back(key);
  while (closed_.size() > std::max<size_t>(options_.max_closed, 1)) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
}

void MessageChannels::FailPendingLocked(const ChannelKey& key, const absl::Status& status) {
  for (auto& [id, p] : pending_) {
    if (p.key == key && !p.result) p.result = status;
  }
}

void MessageChannels::Run() {
  std::vector<zmq::message_t> parts;
  std::vector<zmq::pollitem_t> items;
  std::vector<ChannelKey> keys;  // keys[i] is the channel of items[i + 1]
  while (true) {
    items.assign(1, zmq::pollitem_t{nullptr, wake_fd_, ZMQ_POLLIN, 0});
    keys.clear();
    for (auto& [key, channel] : channels_) {
      items.push_back(zmq::pollitem_t{channel.socket.handle(), 0, ZMQ_POLLIN, 0});
      keys.push_back(key);
    }
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      CONNEX_LOG_ERROR("message channels: poll failed: {}", e.what());
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t counter;
      ssize_t n = read(wake_fd_, &counter, sizeof(counter));
      (void)n;
    }
    // Acknowledgements.
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!(items[i + 1].revents & ZMQ_POLLIN)) continue;
      zmq::socket_t& socket = channels_.at(keys[i]).socket;
      while (true) {
        absl::StatusOr<bool> got = RecvMultipart(socket, &parts);
        if (!got.ok() || !*got) break;
        if (parts.size() != 2 || AsView(parts[1]) != kAck) continue;
        std::optional<uint64_t> id = DecodeId(AsView(parts[0]));
        if (!id) continue;
        connex::MutexLock lock(&mu_);
        auto it = pending_.find(*id);
        if (it != pending_.end() && !it->second.result) it->second.result = absl::OkStatus();
      }
    }
    std::deque<Outgoing> batch;
    std::deque<ChannelKey> to_close;
    {
      connex::MutexLock lock(&mu_);
      if (stop_) break;
      batch.swap(outbox_);
      to_close.swap(to_close_);
      // Channels to close once idle that are idle now.
      for (auto it = closing_.begin(); it != closing_.end();) {
        bool busy = false;
        for (const auto& [id, p] : pending_) busy |= p.key == it->first && !p.result;
        for (const Outgoing& out : batch) busy |= out.key == it->first;
        if (busy) {
          ++it;
          continue;
        }
        to_close.push_back(it->first);
        RememberClosedLocked(it->first, std::move(it->second));
        it = closing_.erase(it);
      }
    }
    for (const ChannelKey& key : to_close) {
      if (channels_.erase(key) > 0) {
        connex::MutexLock lock(&mu_);
        --open_channels_;
      }
    }
    for (Outgoing& out : batch) {
      absl::Status sent;
      {
        connex::MutexLock lock(&mu_);
        auto p = pending_.find(out.id);
        if (p == pending_.end() || p->second.result) continue;  // timed out or closed already
      }
      try {
        auto it = channels_.find(out.key);
        if (it == channels_.end()) {
          zmq::socket_t socket(context_, zmq::socket_type::dealer);
          ConfigureZmqSocket(socket, kMaxMessageBytes);
          socket.set(zmq::sockopt::sndhwm, options_.send_queue);
          MakeCurveClient(socket, options_.curve, out.server_key);
          socket.connect(out.endpoint);
          it = channels_.emplace(out.key, Channel{std::move(socket), out.endpoint}).first;
          connex::MutexLock lock(&mu_);
          ++open_channels_;
          ++opened_;
        }
        std::string id = EncodeId(out.id);
        if (!it->second.socket.send(zmq::buffer(id),
                                    zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
          sent = absl::UnavailableError(StrCat("zmq+", out.endpoint, ": send queue of ",
                                               options_.send_queue, " messages is full"));
        } else {
          it->second.socket.send(zmq::buffer(out.bytes), zmq::send_flags::dontwait);
        }
      } catch (const zmq::error_t& e) {
        sent = absl::UnavailableError(StrCat("zmq+", out.endpoint, ": ", e.what()));
      }
      if (!sent.ok()) {
        connex::MutexLock lock(&mu_);
        auto p = pending_.find(out.id);
        if (p != pending_.end() && !p->second.result) p->second.result = sent;
      }
    }
  }
  channels_.clear();
}

// ---- SendMessage ----

absl::Status SendMessage(zmq::context_t& context, std::string_view address, std::string_view bytes,
                         int64_t timeout_ms, const CurveSettings& curve) {
  absl::StatusOr<Destination> to = DestinationOf(address, bytes.size(), curve);
  if (!to.ok()) return to.status();
  try {
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    ConfigureZmqSocket(socket, kMaxMessageBytes);
    MakeCurveClient(socket, curve, to->server_key);
    socket.connect(to->endpoint);
    std::string id = EncodeId(1);
    socket.send(zmq::buffer(id), zmq::send_flags::sndmore);
    socket.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) {
      return absl::UnavailableError(
          StrCat(address, ": no acknowledgement within ", timeout_ms, " ms"));
    }
    std::vector<zmq::message_t> parts;
    absl::StatusOr<bool> got = RecvMultipart(socket, &parts);
    if (!got.ok() || !*got || parts.size() != 2 || AsView(parts[0]) != id ||
        AsView(parts[1]) != kAck) {
      return absl::UnavailableError(StrCat(address, ": unexpected reply to a message"));
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(StrCat(address, ": ", e.what()));
  }
}

}  // namespace connex::elastic
