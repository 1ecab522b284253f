// The ZeroMQ signal transport with and without CURVE.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>

#include "connex/base/curve.h"
#include "connex/base/mutex.h"
#include "connex/base/wait.h"
#include "connex/pp/signal_transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::pp {
namespace {

using ::testing::HasSubstr;

struct Inbox {
  void Add(std::string frame) {
    connex::MutexLock lock(&mu);
    frames.push_back(std::move(frame));
  }
  bool Has(const std::string& frame) const {
    connex::MutexLock lock(&mu);
    for (const std::string& f : frames) {
      if (f == frame) return true;
    }
    return false;
  }
  mutable connex::Mutex mu;
  std::vector<std::string> frames ABSL_GUARDED_BY(mu);
};

std::unique_ptr<SignalTransport> Make(const CurveSettings& curve, Inbox* inbox = nullptr) {
  absl::StatusOr<std::unique_ptr<SignalTransport>> t = CreateZmqSignalTransport("127.0.0.1", curve);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return nullptr;
  if (inbox != nullptr) (*t)->SetReceiver([inbox](std::string f) { inbox->Add(std::move(f)); });
  return *std::move(t);
}

TEST(ZmqSignalTest, CurvePeersWithAuthorizedKeysTalkAndStrangersAreRefused) {
  absl::StatusOr<CurveKeyPair> deploy = GenerateCurveKeyPair();
  absl::StatusOr<CurveKeyPair> other = GenerateCurveKeyPair();
  ASSERT_TRUE(deploy.ok() && other.ok());
  Inbox a_in, plain_in;
  auto a = Make(CurveSettings::Shared(*deploy), &a_in);
  auto b = Make(CurveSettings::Shared(*deploy));
  auto stranger = Make(CurveSettings::Shared(*other));
  auto plain = Make({}, &plain_in);
  ASSERT_TRUE(a && b && stranger && plain);
  EXPECT_THAT(a->address(), HasSubstr("?curve="));  // its key travels with its address
  EXPECT_THAT(plain->address(), ::testing::Not(HasSubstr("curve")));

  // A key the receiver does not authorize: the handshake is refused, nothing is delivered.
  stranger->Send(a->address(), "from a stranger");
  ASSERT_TRUE(WaitUntil([&] { return a->connections_refused() >= 1; }, 5000));
  // No CURVE on one side: the sender refuses to talk at all (said once in its log).
  plain->Send(a->address(), "in clear");
  a->Send(plain->address(), "to a plain peer");
  // The authorized peer gets through, after all of the above were sent.
  b->Send(a->address(), "hello");
  ASSERT_TRUE(WaitUntil([&] { return a_in.Has("hello"); }, 5000));
  EXPECT_FALSE(a_in.Has("from a stranger"));
  EXPECT_FALSE(a_in.Has("in clear"));
  EXPECT_FALSE(plain_in.Has("to a plain peer"));
}

size_t OpenFds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Issue 23: a stage kept one socket per address a frame named (forged PINGs took one from 35 to
// 1,057 fds, after which it could not reach its real peers). The sockets kept are bounded, the
// least recently used closed first, and a forgotten address's socket is closed at once; the
// peers that are talked to still get their frames.
TEST(ZmqSignalTest, SocketsKeptForDestinationsAreBounded) {
  Inbox peer_in;
  auto t = Make({});
  auto peer = Make({}, &peer_in);
  ASSERT_TRUE(t && peer);
  t->Send(peer->address(), "before");
  ASSERT_TRUE(WaitUntil([&] { return peer_in.Has("before"); }, 5000));
  const size_t before = OpenFds();
  // 1,000 addresses a forger could name as reply_to (privileged ports of loopback, where
  // nothing of a test listens; ZeroMQ connects lazily, so nothing needs to answer).
  for (int port = 1; port <= 1000; ++port) {
    t->Send("pp+tcp://127.0.0.1:" + std::to_string(port), "x");
  }
  t->Send(peer->address(), "after");
  ASSERT_TRUE(WaitUntil([&] { return peer_in.Has("after"); }, 10000));
  // ZeroMQ closes an evicted socket on its I/O and reaper threads, some time after: right after
  // the burst this process held 280 to 730 fds, 30 % of runs over the old bound read at once
  // (before + 576). What is checked is the count it settles to, within 300 ms in every run: one
  // fd per kept socket, 280 (one socket per address would stay above 1,000).
  const size_t bound = before + 256 + 64;
  const size_t right_after = OpenFds();
  size_t after = right_after;
  WaitUntil([&] { return (after = OpenFds()) < bound; }, 10000);
  std::printf("fds: %zu before, %zu right after sending to 1000 addresses, %zu settled\n", before,
              right_after, after);
  EXPECT_LT(after, bound) << "one socket per address, unbounded";
  t->Forget(peer->address());
  t->Send(peer->address(), "reconnected");
  EXPECT_TRUE(WaitUntil([&] { return peer_in.Has("reconnected"); }, 5000));
}

TEST(ZmqSignalTest, ANonLoopbackHostNeedsCurveOrInsecure) {
  unsetenv("CONNEX_INSECURE");
  absl::StatusOr<std::unique_ptr<SignalTransport>> open = CreateZmqSignalTransport("0.0.0.0");
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(open.status().message(), HasSubstr("--insecure"));
  absl::StatusOr<CurveKeyPair> keys = GenerateCurveKeyPair();
  ASSERT_TRUE(keys.ok());
  EXPECT_TRUE(CreateZmqSignalTransport("0.0.0.0", CurveSettings::Shared(*keys)).ok());
  setenv("CONNEX_INSECURE", "1", 1);
  EXPECT_TRUE(CreateZmqSignalTransport("0.0.0.0").ok());
  unsetenv("CONNEX_INSECURE");
}

}  // namespace
}  // namespace connex::pp
