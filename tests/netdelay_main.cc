// connex-netdelay: holds every packet of one NFQUEUE for a fixed time before it lets it go — the
// latency of a link in tests on network-namespace hosts (connex/chaos/hosts.h), where the kernel
// has neither netem nor a qdisc that honours departure times. Packets leave in arrival order,
// each `--delay-us` after it arrived (only its metadata is copied to this process). Prints
// "ready queue=N" once bound; runs until SIGTERM or SIGKILL. Single-threaded.
//
//   connex-netdelay --queue 7 --delay-us 2500     # with: iptables -A OUTPUT ... -j NFQUEUE
//                                                 #         --queue-num 7
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <time.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>

namespace {

struct Held {
  uint32_t id;
  int64_t due_ns;
};

struct State {
  std::deque<Held> held;
  int64_t delay_ns = 0;
};

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int OnPacket(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* data) {
  auto* state = static_cast<State*>(data);
  nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
  if (ph != nullptr) state->held.push_back({ntohl(ph->packet_id), NowNs() + state->delay_ns});
  return 0;
}

volatile sig_atomic_t stopping = 0;
void OnSignal(int) { stopping = 1; }

int Usage(const char* why) {
  std::fprintf(stderr, "connex-netdelay: %s\nusage: connex-netdelay --queue N --delay-us US\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long queue = -1, delay_us = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    char* end = nullptr;
    const long v = std::strtol(argv[i + 1], &end, 10);
    if (*end != '\0' || v < 0) return Usage(("bad value of " + flag).c_str());
    if (flag == "--queue") {
      queue = v;
    } else if (flag == "--delay-us") {
      delay_us = v;
    } else {
      return Usage(("unknown flag " + flag).c_str());
    }
  }
  if (queue < 0 || queue > 65535 || delay_us < 0 || delay_us > 10'000'000) {
    return Usage("--queue (0 .. 65535) and --delay-us (0 .. 10000000) are required");
  }
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  State state;
  state.delay_ns = delay_us * 1000;
  nfq_handle* h = nfq_open();
  if (h == nullptr) {
    std::fprintf(stderr, "connex-netdelay: nfq_open: %s\n", std::strerror(errno));
    return 1;
  }
  nfq_q_handle* qh = nfq_create_queue(h, static_cast<uint16_t>(queue), &OnPacket, &state);
  if (qh == nullptr) {
    std::fprintf(stderr, "connex-netdelay: queue %ld: %s\n", queue, std::strerror(errno));
    return 1;
  }
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
    std::fprintf(stderr, "connex-netdelay: copy mode: %s\n", std::strerror(errno));
    return 1;
  }
  nfq_set_queue_maxlen(qh, 1 << 16);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 16 << 20);
  const int fd = nfq_fd(h);
  std::printf("ready queue=%ld delay_us=%ld\n", queue, delay_us);
  std::fflush(stdout);
  char buf[4096] __attribute__((aligned));
  while (!stopping) {
    int64_t now = NowNs();
    while (!state.held.empty() && state.held.front().due_ns <= now) {
      nfq_set_verdict(qh, state.held.front().id, NF_ACCEPT, 0, nullptr);
      state.held.pop_front();
    }
    timespec wait = {1, 0};
    if (!state.held.empty()) {
      const int64_t ns = state.held.front().due_ns - now;
      wait = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    }
    pollfd p = {fd, POLLIN, 0};
    if (ppoll(&p, 1, &wait, nullptr) <= 0) continue;
    // Drain what is there without blocking, so that a burst is stamped when it came.
    for (;;) {
      const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0) break;  // EAGAIN, or ENOBUFS (the kernel dropped; it is counted there)
      nfq_handle_packet(h, buf, static_cast<int>(n));
    }
  }
  // Let what is held go before leaving (the rule is removed first by the harness).
  for (const Held& held : state.held) nfq_set_verdict(qh, held.id, NF_ACCEPT, 0, nullptr);
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}
