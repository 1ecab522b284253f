// The ZeroMQ signal transport: `pp+tcp://HOST:PORT`, with CURVE `pp+tcp://HOST:PORT?curve=HEX`
// (the ROUTER's public key, so that a sender learns it from the directory with the address). One
// I/O thread owns the ROUTER that receives and one DEALER per destination; other threads hand
// frames over through a queue and an eventfd.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "connex/base/curve.h"
#include "connex/base/curve_zmq.h"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/zmq_util.h"
#include "connex/pp/signal_transport.h"

namespace connex::pp {
namespace {

constexpr std::string_view kScheme = "pp+tcp://";
constexpr int64_t kMaxSignalBytes = 4 << 20;
constexpr std::string_view kCurveQuery = "?curve=";
// Sockets kept for destinations (one DEALER, one fd each): past this many the least recently used
// is closed, so no number of addresses a peer names can exhaust the process's descriptors.
constexpr size_t kMaxDealers = 256;

class ZmqSignalTransport : public SignalTransport {
 public:
  explicit ZmqSignalTransport(CurveSettings curve) : curve_(std::move(curve)), context_(1) {}
  ~ZmqSignalTransport() override {
    Close();
    zap_.reset();  // before the context goes
  }

  absl::Status Start(const std::string& host) {
    CONNEX_RETURN_IF_ERROR(CheckListenExposure("step-protocol signals", host, curve_.enabled()));
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
    if (curve_.enabled()) {
      CONNEX_ASSIGN_OR_RETURN(zap_, ZapHandler::Start(context_, curve_.authorized, "pp signals"));
    }
    router_ = zmq::socket_t(context_, zmq::socket_type::router);
    ConfigureZmqSocket(router_, kMaxSignalBytes);
    MakeCurveServer(router_, curve_);
    absl::StatusOr<std::string> bound = BindZmq(router_, StrCat("tcp://", host, ":0"));
    if (!bound.ok()) return bound.status();
    address_ = StrCat("pp+", *bound);
    if (curve_.enabled()) address_ += StrCat(kCurveQuery, CurveKeyToHex(curve_.keys->public_key));
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  const std::string& address() const override { return address_; }
  uint64_t connections_refused() const override { return zap_ ? zap_->refused() : 0; }

  void SetReceiver(Receiver receiver) override {
    connex::MutexLock lock(&mu_);
    receiver_ = std::move(receiver);
  }

  void Send(const std::string& address, std::string frame) override {
    {
      connex::MutexLock lock(&mu_);
      if (closed_) return;
      outbox_.emplace_back(address, std::move(frame));
    }
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }

  void Forget(const std::string& address) override {
    {
      connex::MutexLock lock(&mu_);
      if (closed_) return;
      forget_.push_back(address);
    }
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }

  void Close() override {
    {
      connex::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
    }
    stop_.store(true);
    uint64_t one = 1;
    if (wake_fd_ >= 0) {
      ssize_t n = write(wake_fd_, &one, sizeof(one));
      (void)n;
    }
    if (thread_.joinable()) thread_.join();
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = -1;
  }

 private:
  // The DEALER to `address`; nullptr (said once per address) when this transport and the
  // peer disagree on CURVE, or the peer's key is malformed.
  zmq::socket_t* DealerFor(const std::string& address) {
    auto it = dealers_.find(address);
    if (it != dealers_.end()) {
      it->second.last_use = ++uses_;
      return &it->second.socket;
    }
    if (refused_.count(address)) return nullptr;
    std::string endpoint = address.substr(3);  // drop "pp+"
    std::string server_key;
    size_t query = endpoint.find(kCurveQuery);
    if (query != std::string::npos) {
      absl::StatusOr<std::string> key =
          CurveKeyFromHex(std::string_view(endpoint).substr(query + kCurveQuery.size()));
      endpoint.resize(query);
      if (!key.ok()) return Refuse(address, AsStd(key.status().message()));
      server_key = *key;
    }
    if (curve_.enabled() && server_key.empty()) {
      return Refuse(address, "the peer does not use CURVE and this node does");
    }
    if (!curve_.enabled() && !server_key.empty()) {
      return Refuse(address,
                    "the peer uses CURVE and this node has no key (CONNEX_CURVE_KEY_FILE)");
    }
    if (dealers_.size() >= kMaxDealers) {
      auto oldest = std::min_element(dealers_.begin(), dealers_.end(), [](auto& a, auto& b) {
        return a.second.last_use < b.second.last_use;
      });
      dealers_.erase(oldest);
    }
    zmq::socket_t dealer(context_, zmq::socket_type::dealer);
    ConfigureZmqSocket(dealer, kMaxSignalBytes);
    dealer.set(zmq::sockopt::sndhwm, 10000);
    MakeCurveClient(dealer, curve_, server_key);
    dealer.connect(endpoint);
    Dealer& added = dealers_[address];
    added.socket = std::move(dealer);
    added.last_use = ++uses_;
    return &added.socket;
  }

  zmq::socket_t* Refuse(const std::string& address, std::string_view why) {
    CONNEX_LOG_ERROR("pp signals: not sending to {}: {}", address, why);
    if (refused_.size() < 4096) refused_.insert(address);
    return nullptr;
  }

  void Run() {
    std::vector<zmq::message_t> parts;
    while (!stop_.load()) {
      zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                                 {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(100));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        CONNEX_LOG_ERROR("pp signals: poll failed: {}", e.what());
        return;
      }
      if (items[1].revents & ZMQ_POLLIN) {
        uint64_t counter;
        ssize_t n = read(wake_fd_, &counter, sizeof(counter));
        (void)n;
      }
      std::deque<std::pair<std::string, std::string>> batch;
      std::vector<std::string> forget;
      Receiver receiver;
      {
        connex::MutexLock lock(&mu_);
        batch.swap(outbox_);
        forget.swap(forget_);
        receiver = receiver_;
      }
      for (const std::string& address : forget) dealers_.erase(address);
      for (auto& [address, frame] : batch) {
        if (address.rfind(kScheme, 0) != 0) {
          CONNEX_LOG_WARN("pp signals: cannot send to '{}' (not {}...)", address, kScheme);
          continue;
        }
        try {
          zmq::socket_t* dealer = DealerFor(address);
          if (dealer != nullptr) dealer->send(zmq::buffer(frame), zmq::send_flags::dontwait);
        } catch (const zmq::error_t& e) {
          CONNEX_LOG_DEBUG("pp signals: send to {} failed: {}", address, e.what());
        }
      }
      while (true) {
        absl::StatusOr<bool> got = RecvMultipart(router_, &parts);
        if (!got.ok() || !*got) break;
        if (parts.size() != 2 || !receiver) continue;
        receiver(std::string(AsView(parts[1])));
      }
    }
    dealers_.clear();
    router_.close();
  }

  const CurveSettings curve_;
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;  // with CURVE: which client keys get in
  std::set<std::string> refused_;    // I/O thread: addresses we cannot talk to
  zmq::socket_t router_;             // I/O thread
  struct Dealer {
    zmq::socket_t socket;
    uint64_t last_use = 0;
  };
  std::map<std::string, Dealer> dealers_;  // I/O thread, at most kMaxDealers
  uint64_t uses_ = 0;                      // I/O thread: the clock of Dealer::last_use
  std::string address_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  connex::Mutex mu_;
  std::deque<std::pair<std::string, std::string>> outbox_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> forget_ ABSL_GUARDED_BY(mu_);
  Receiver receiver_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SignalTransport>> CreateZmqSignalTransport(
    const std::string& host, const CurveSettings& curve) {
  auto transport = std::make_unique<ZmqSignalTransport>(curve);
  absl::Status started = transport->Start(host);
  if (!started.ok()) return started;
  return transport;
}

}  // namespace connex::pp
