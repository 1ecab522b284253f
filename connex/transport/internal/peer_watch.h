// PeerWatch: the client side of peer liveness for the socket-based backends (tcp, shm, ucx).
// It owns one control connection per connected peer on its own progress thread: EOF or a
// socket error is a peer death (reported within the epoll wake-up, i.e. milliseconds), and a
// PING every heartbeat_ms without any answer for suspect_ms is a suspicion (a hung or stopped
// peer, a cut link), cleared by the next answer. Thread-safe.
#ifndef CONNEX_TRANSPORT_INTERNAL_PEER_WATCH_H_
#define CONNEX_TRANSPORT_INTERNAL_PEER_WATCH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "connex/base/mutex.h"
#include "connex/transport/internal/event_hub.h"
#include "connex/transport/internal/socket.h"

namespace connex::transport::internal {

// What readers check: set by the watch thread, read by anyone.
struct Liveness {
  Lid lid;
  std::string address;
  std::atomic<bool> dead{false};
  std::atomic<bool> suspected{false};
  std::atomic<int64_t> last_rx_us{0};
};

class PeerWatch {
 public:
  // Frames other than PONG that arrive on a control connection (e.g. ucx INVALIDATE); runs on
  // the watch thread, without the watch's lock, and may block briefly; replies go to `fd`.
  using FrameHandler =
      std::function<void(int fd, const FrameHeader& h, const std::string& payload)>;

  PeerWatch(EventHub& hub, std::string backend, int heartbeat_ms, int suspect_ms);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Takes a connected, handshaken control connection to `lid`; publishes kConnected.
  std::shared_ptr<Liveness> Watch(Fd control, const Lid& lid, const std::string& address,
                                  FrameHandler handler = nullptr);
  // Marks the peer dead and publishes kDead once (e.g. from a UCX endpoint error); the control
  // connection is closed with the next poll.
  void ReportDead(const std::shared_ptr<Liveness>& liveness, const std::string& detail);
  // Stops watching (the connection was replaced); closes it without an event.
  void Unwatch(const std::shared_ptr<Liveness>& liveness);

 private:
  struct Entry {
    std::shared_ptr<Fd> fd;  // shared: a handler running outside the lock keeps it open
    std::shared_ptr<Liveness> liveness;
    FrameHandler handler;
    std::string buffer;   // bytes of a partially received frame
    std::string pending;  // PINGs not yet accepted by the socket
  };
  void Run();
  void Wake();
  struct Dispatch {
    std::shared_ptr<Fd> fd;
    FrameHandler handler;
    FrameHeader header;
    std::string payload;
  };
  // Reads what arrived; frames for the handler are appended to `out` (called without mu_).
  void ReadFrom(Entry& e, std::vector<Dispatch>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDead(Entry& e, const std::string& detail) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EventHub& hub_;
  const std::string backend_;
  const int heartbeat_ms_;
  const int suspect_ms_;
  Fd epoll_;
  Fd wake_;
  Mutex mu_;
  std::map<int, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by fd
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace connex::transport::internal

#endif  // CONNEX_TRANSPORT_INTERNAL_PEER_WATCH_H_
