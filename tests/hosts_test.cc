// The namespace hosts themselves (connex/chaos/hosts.h): each host reaches the others and this
// process at its own address; loss, rate and delay act on a host's link; a host lost whole has
// no process left and no link; a host cut off keeps its processes and comes back. Label hosts.
#include "connex/chaos/hosts.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "gtest/gtest.h"

namespace connex::chaos {
namespace {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// How long a TCP connect from here to host:port takes (one round trip), or -1 when it fails
// within `timeout_ms`.
int64_t ConnectUs(const std::string& host, int port, int timeout_ms = 2000) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  const int64_t start = NowUs();
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    rc = (poll(&p, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
          err == 0)
             ? 0
             : -1;
  }
  const int64_t took = NowUs() - start;
  close(fd);
  return rc == 0 ? took : -1;
}

class HostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = Hosts::Available(); !s.ok()) {
      GTEST_SKIP() << "namespace hosts cannot be made here: " << s.message();
    }
    dir_ = StrCat(::testing::TempDir(), "/hosts-", getpid());
    std::filesystem::create_directories(dir_);
    HostsOptions o;
    o.hosts = 3;
    o.work_dir = dir_;
    absl::StatusOr<std::unique_ptr<Hosts>> h = Hosts::Make(o);
    ASSERT_TRUE(h.ok()) << h.status();
    hosts_ = std::move(*h);
  }
  // A TCP listener on `port` in `host` (iperf3's server: it answers connects and measures).
  int Listen(int host, int port) {
    absl::StatusOr<int> p = hosts_->Start(
        host, StrCat("iperf3-h", host, "-", port),
        {"/usr/bin/iperf3", "-s", "--forceflush", "-B", hosts_->address(host), "-p", StrCat(port)});
    EXPECT_TRUE(p.ok()) << p.status();
    // Its own word, not a probe connection: iperf3 takes any connection for a client's, and a
    // probe that goes at once can make it reset the next one.
    EXPECT_TRUE(hosts_->process(*p).WaitForLine("Server listening", 10'000).has_value());
    return *p;
  }
  // A listener on `port` in `host` that accepts every connection and closes it: what a bare
  // connect measures against. Not iperf3's server, which takes a connection for a client's and
  // may close its listening socket while it gives up on it.
  int Acceptor(int host, int port) {
    const std::string script = StrCat(
        "import socket,sys\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('",
        hosts_->address(host), "', ", port,
        ")); s.listen(128); print('accepting', flush=True)\n"
        "while True:\n  c,_=s.accept(); c.close()\n");
    absl::StatusOr<int> p = hosts_->Start(host, StrCat("acceptor-h", host, "-", port),
                                          {"/usr/bin/python3", "-c", script});
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(hosts_->process(*p).WaitForLine("accepting", 10'000).has_value());
    return *p;
  }
  std::string dir_;
  std::unique_ptr<Hosts> hosts_;
};

TEST_F(HostsTest, EachHostHasItsAddressAndReachesTheOthers) {
  ASSERT_EQ(access("/usr/bin/iperf3", X_OK), 0) << "iperf3 (scripts/install-deps.sh)";
  Listen(1, 5201);
  // From another host, then from this process (the bridge).
  absl::StatusOr<std::string> out = hosts_->Exec(
      2, {"/usr/bin/iperf3", "-c", hosts_->address(1), "-p", "5201", "-t", "1", "-f", "m"});
  ASSERT_TRUE(out.ok()) << out.status();
  std::printf("host 2 -> host 1, clean link:\n%s\n", out->c_str());
  Acceptor(1, 5211);
  EXPECT_GE(ConnectUs(hosts_->address(1), 5211), 0);
  absl::StatusOr<std::string> addr = hosts_->Exec(0, {"ip", "-4", "-o", "addr", "show", "eth0"});
  ASSERT_TRUE(addr.ok()) << addr.status();
  EXPECT_NE(addr->find(hosts_->address(0) + "/24"), std::string::npos) << *addr;
}

// A process started in a host has the host's name as its host name (a UTS namespace of its
// own): what tells same-host peers (shm) from the others.
TEST_F(HostsTest, EachHostHasAHostNameOfItsOwn) {
  for (int host : {1, 2}) {
    absl::StatusOr<int> p = hosts_->Start(host, StrCat("hostname-h", host), {"/bin/hostname"});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(hosts_->process(*p).WaitForLine(hosts_->netns(host), 10'000))
        << "host " << host << " is not named " << hosts_->netns(host);
  }
  char mine[256] = {};
  ASSERT_EQ(gethostname(mine, sizeof(mine) - 1), 0);
  EXPECT_NE(std::string(mine), hosts_->netns(1));  // this process's name is untouched
}

TEST_F(HostsTest, DelayHoldsEveryPacketAHostSends) {
  Acceptor(1, 5202);
  int64_t clean = ConnectUs(hosts_->address(1), 5202);
  ASSERT_GE(clean, 0);
  absl::Status s = hosts_->SetDelay(1, 20'000);
  if (absl::IsFailedPrecondition(s)) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s;
  // The SYN-ACK waits 20 ms in host 1: every connect takes at least that long.
  for (int i = 0; i < 5; ++i) {
    const int64_t delayed = ConnectUs(hosts_->address(1), 5202);
    ASSERT_GE(delayed, 20'000) << "connect " << i << " took " << delayed << " us";
    std::printf("connect to host 1: clean %lld us, with 20 ms delay %lld us\n",
                static_cast<long long>(clean), static_cast<long long>(delayed));
  }
  ASSERT_TRUE(hosts_->SetDelay(1, 0).ok());
  EXPECT_TRUE(WaitUntil([&] { return ConnectUs(hosts_->address(1), 5202) < 20'000; }, 5000));
}

TEST_F(HostsTest, LossDropsWhatAHostReceivesAndRateLimitsWhatItSends) {
  // One server per client run: iperf3's server may still be closing the first test when the
  // second client arrives ("the server is busy").
  Listen(1, 5203);
  Listen(1, 5213);
  ASSERT_TRUE(hosts_->SetLoss(1, 0.05).ok());
  ASSERT_TRUE(hosts_->SetRate(1, 20'000'000).ok());
  // Host 0 sends to host 1 (5 % of it dropped), then host 1 sends (at most 20 Mbit/s).
  absl::StatusOr<std::string> up = hosts_->Exec(
      0, {"/usr/bin/iperf3", "-c", hosts_->address(1), "-p", "5203", "-t", "1", "-f", "m"});
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<std::string> down = hosts_->Exec(
      0, {"/usr/bin/iperf3", "-c", hosts_->address(1), "-p", "5213", "-t", "1", "-R", "-f", "m"});
  ASSERT_TRUE(down.ok()) << down.status();
  std::printf("with 5 %% loss into host 1:\n%s\nhost 1 sending at 20 Mbit/s:\n%s\n", up->c_str(),
              down->c_str());
  absl::StatusOr<std::string> rules =
      hosts_->Exec(1, {"iptables", "-L", "INPUT", "-v", "-x", "-n"});
  ASSERT_TRUE(rules.ok()) << rules.status();
  // The DROP rule's packet counter (first column of its line) is not zero.
  size_t at = rules->find("DROP");
  ASSERT_NE(at, std::string::npos) << *rules;
  size_t line = rules->rfind('\n', at);
  EXPECT_GT(std::stoll(rules->substr(line + 1)), 0) << *rules;
  absl::StatusOr<std::string> qdisc = hosts_->Exec(1, {"tc", "-s", "qdisc", "show", "dev", "eth0"});
  ASSERT_TRUE(qdisc.ok());
  EXPECT_NE(qdisc->find("tbf"), std::string::npos) << *qdisc;
  ASSERT_TRUE(hosts_->SetLoss(1, 0).ok());
  ASSERT_TRUE(hosts_->SetRate(1, 0).ok());
  rules = hosts_->Exec(1, {"iptables", "-S", "INPUT"});
  EXPECT_EQ(rules->find("DROP"), std::string::npos) << *rules;
}

TEST_F(HostsTest, AHostLostWholeHasNoProcessAndNoLink) {
  const int a = Acceptor(2, 5204);
  absl::StatusOr<int> sleeper = hosts_->Start(2, "sleep-h2", {"/bin/sleep", "600"});
  ASSERT_TRUE(sleeper.ok());
  ASSERT_TRUE(hosts_->Lose(2).ok());
  EXPECT_FALSE(hosts_->running(a));
  EXPECT_FALSE(hosts_->running(*sleeper));
  absl::StatusOr<std::string> pids = hosts_->Exec(0, {"ip", "netns", "pids", hosts_->netns(2)});
  ASSERT_TRUE(pids.ok());
  EXPECT_EQ(*pids, "");
  EXPECT_LT(ConnectUs(hosts_->address(2), 5204, 300), 0);
}

TEST_F(HostsTest, AHostCutOffKeepsItsProcessesAndComesBack) {
  const int a = Acceptor(0, 5205);
  ASSERT_TRUE(hosts_->Cut(0).ok());
  EXPECT_LT(ConnectUs(hosts_->address(0), 5205, 300), 0);
  EXPECT_TRUE(hosts_->running(a));
  ASSERT_TRUE(hosts_->Heal(0).ok());
  EXPECT_TRUE(WaitUntil([&] { return ConnectUs(hosts_->address(0), 5205, 300) >= 0; }, 10'000));
}

}  // namespace
}  // namespace connex::chaos
