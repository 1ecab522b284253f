#include "connex/transport/internal/peer_watch.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "connex/base/strings.h"

namespace connex::transport::internal {

PeerWatch::PeerWatch(EventHub& hub, std::string backend, int heartbeat_ms, int suspect_ms)
    : hub_(hub),
      backend_(std::move(backend)),
      heartbeat_ms_(heartbeat_ms),
      suspect_ms_(suspect_ms),
      epoll_(epoll_create1(EPOLL_CLOEXEC)),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_.get();
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
  thread_ = std::thread([this] { Run(); });
}

PeerWatch::~PeerWatch() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
}

void PeerWatch::Wake() {
  uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
}

std::shared_ptr<Liveness> PeerWatch::Watch(Fd control, const Lid& lid, const std::string& address,
                                           FrameHandler handler) {
  auto liveness = std::make_shared<Liveness>();
  liveness->lid = lid;
  liveness->address = address;
  liveness->last_rx_us = NowUs();
  int fd = control.get();
  {
    MutexLock lock(&mu_);
    Entry& e = entries_[fd];
    e.fd = std::make_shared<Fd>(std::move(control));
    e.liveness = liveness;
    e.handler = std::move(handler);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
    hub_.Publish(
        PeerEvent{PeerEventKind::kConnected, lid, address, StrCat(backend_, ": connected")});
  }
  Wake();
  return liveness;
}

void PeerWatch::Unwatch(const std::shared_ptr<Liveness>& liveness) {
  MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.liveness == liveness) {
      epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->first, nullptr);
      entries_.erase(it);
      return;
    }
  }
}

void PeerWatch::ReportDead(const std::shared_ptr<Liveness>& liveness, const std::string& detail) {
  if (liveness->dead.exchange(true)) return;
  hub_.Publish(PeerEvent{PeerEventKind::kDead, liveness->lid, liveness->address,
                         StrCat(backend_, ": ", detail)});
}

void PeerWatch::MarkDead(Entry& e, const std::string& detail) {
  if (e.liveness->dead.exchange(true)) return;
  hub_.Publish(PeerEvent{PeerEventKind::kDead, e.liveness->lid, e.liveness->address,
                         StrCat(backend_, ": ", detail)});
}

void PeerWatch::ReadFrom(Entry& e, std::vector<Dispatch>* out) {
  char buf[4096];
  while (true) {
    ssize_t n = recv(e.fd->get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      e.buffer.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      MarkDead(e, "connection closed by peer");
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      MarkDead(e, StrCat("connection lost: ", std::strerror(errno)));
      return;
    }
    break;
  }
  e.liveness->last_rx_us = NowUs();
  if (e.liveness->suspected.exchange(false)) {
    hub_.Publish(PeerEvent{PeerEventKind::kConnected, e.liveness->lid, e.liveness->address,
                           StrCat(backend_, ": answering heartbeats again")});
  }
  while (e.buffer.size() >= sizeof(FrameHeader)) {
    FrameHeader h;
    std::memcpy(&h, e.buffer.data(), sizeof(h));
    if (h.magic != kFrameMagic || h.payload > kMaxFramePayload) {
      MarkDead(e, "malformed frame on the control connection");
      return;
    }
    if (e.buffer.size() < sizeof(h) + h.payload) break;
    std::string payload = e.buffer.substr(sizeof(h), h.payload);
    e.buffer.erase(0, sizeof(h) + h.payload);
    if (h.type != static_cast<uint16_t>(FrameType::kPong) && e.handler) {
      out->push_back(Dispatch{e.fd, e.handler, h, std::move(payload)});
    }
  }
}

void PeerWatch::Run() {
  int64_t next_beat = NowUs();
  while (true) {
    int64_t now = NowUs();
    int timeout_ms = static_cast<int>(std::max<int64_t>(0, (next_beat - now) / 1000));
    epoll_event events[64];
    int n = epoll_wait(epoll_.get(), events, 64, timeout_ms);
    std::vector<Dispatch> dispatch;
    MutexLock lock(&mu_);
    if (stop_) return;
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_.get()) {
        uint64_t v;
        (void)!read(wake_.get(), &v, sizeof(v));
        continue;
      }
      auto it = entries_.find(fd);
      if (it == entries_.end()) continue;
      ReadFrom(it->second, &dispatch);
      if (!it->second.liveness->dead && (events[i].events & (EPOLLHUP | EPOLLERR))) {
        MarkDead(it->second, "connection lost");
      }
      if (it->second.liveness->dead) {
        epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
        entries_.erase(it);
      }
    }
    if (!dispatch.empty()) {
      mu_.Unlock();
      for (Dispatch& d : dispatch) d.handler(d.fd->get(), d.header, d.payload);
      dispatch.clear();
      mu_.Lock();
      if (stop_) return;
    }
    now = NowUs();
    if (now >= next_beat) {
      next_beat = now + int64_t{heartbeat_ms_} * 1000;
      FrameHeader ping = MakeFrame(FrameType::kPing);
      for (auto& [fd, e] : entries_) {
        // Non-blocking: a peer that does not read is a suspect, not a reason to stall.
        if (e.pending.size() < 4096) e.pending.append(reinterpret_cast<char*>(&ping), sizeof(ping));
        ssize_t sent = send(fd, e.pending.data(), e.pending.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent > 0) e.pending.erase(0, static_cast<size_t>(sent));
        if (now - e.liveness->last_rx_us > int64_t{suspect_ms_} * 1000 &&
            !e.liveness->suspected.exchange(true)) {
          hub_.Publish(PeerEvent{PeerEventKind::kSuspected, e.liveness->lid, e.liveness->address,
                                 StrCat(backend_, ": no heartbeat answer for ",
                                        (now - e.liveness->last_rx_us) / 1000, " ms")});
        }
      }
    }
  }
}

}  // namespace connex::transport::internal
