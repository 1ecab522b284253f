#include "connex/elastic/channel.h"

#include <chrono>
#include <vector>

#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"

namespace connex::elastic {
namespace {
constexpr std::string_view kAck = "ACK";
}

absl::StatusOr<std::unique_ptr<MessageInbox>> MessageInbox::Start(std::string host) {
  std::unique_ptr<MessageInbox> inbox(new MessageInbox());
  inbox->socket_ = zmq::socket_t(inbox->context_, zmq::socket_type::router);
  ConfigureZmqSocket(inbox->socket_, kMaxMessageBytes);
  absl::StatusOr<std::string> bound = BindZmq(inbox->socket_, StrCat("tcp://", host, ":0"));
  if (!bound.ok()) return bound.status();
  inbox->address_ = StrCat("zmq+", *bound);
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
      if (parts.size() != 2) continue;
      {
        connex::MutexLock lock(&mu_);
        queue_.emplace_back(AsView(parts[1]));
      }
      try {
        socket_.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
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
  return out;
}

absl::Status SendMessage(zmq::context_t& context, std::string_view address, std::string_view bytes,
                         int64_t timeout_ms) {
  if (address.substr(0, kMessageScheme.size()) != kMessageScheme) {
    return absl::InvalidArgumentError(
        StrCat("message address '", address, "' must look like zmq+tcp://HOST:PORT"));
  }
  if (static_cast<int64_t>(bytes.size()) > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        StrCat("message of ", bytes.size(), " bytes exceeds the limit of ", kMaxMessageBytes));
  }
  std::string endpoint(address.substr(4));  // drop "zmq+"
  absl::Status endpoint_ok = ParseTcpEndpoint(endpoint).status();
  if (!endpoint_ok.ok()) return endpoint_ok;
  try {
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    ConfigureZmqSocket(socket, kMaxMessageBytes);
    socket.connect(endpoint);
    socket.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) {
      return absl::UnavailableError(
          StrCat(address, ": no acknowledgement within ", timeout_ms, " ms"));
    }
    zmq::message_t ack;
    (void)socket.recv(ack, zmq::recv_flags::none);
    if (AsView(ack) != kAck) {
      return absl::UnavailableError(StrCat(address, ": unexpected reply to a message"));
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(StrCat(address, ": ", e.what()));
  }
}

}  // namespace connex::elastic
