// DirectoryClient on an injected clock (issue 9): request deadlines, the HELLO of Connect and
// AwaitView follow the clock the client was given, so a timeout test advances a FakeClock
// instead of waiting out real minutes.
#include "connex/directory/client.h"

#include <chrono>
#include <future>
#include <thread>

#include "connex/base/clock.h"
#include "connex/base/codec.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/protocol.h"
#include "gtest/gtest.h"
#include "zmq.hpp"

namespace connex::directory {
namespace {

// A directory that answers HELLO (when `answer_hello`) and then nothing at all, as a hung
// directory process would. Owned by the test thread; its socket lives on its own thread.
class SilentDirectory {
 public:
  explicit SilentDirectory(bool answer_hello) : context_(1) {
    router_ = zmq::socket_t(context_, zmq::socket_type::router);
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:0");
    pub_ = zmq::socket_t(context_, zmq::socket_type::pub);
    pub_.set(zmq::sockopt::linger, 0);
    pub_.bind("tcp://127.0.0.1:0");
    address_ = router_.get(zmq::sockopt::last_endpoint);
    pub_address_ = pub_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this, answer_hello] { Run(answer_hello); });
  }
  ~SilentDirectory() {
    stop_.store(true);
    thread_.join();
  }
  const std::string& address() const { return address_; }
  int requests_seen() const { return requests_.load(); }

 private:
  void Run(bool answer_hello) {
    while (!stop_.load()) {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t identity, frame;
      (void)router_.recv(identity);
      (void)router_.recv(frame);
      auto decoded =
          wire::DecodeFrame(std::string_view(static_cast<const char*>(frame.data()), frame.size()));
      if (decoded.ok() && decoded->type == kHello && answer_hello) {
        wire::MapBuilder out;
        out.Uint("id", 0)
            .Str("pub", pub_address_)
            .Uint("incarnation", 1)
            .Uint("revision", 0)
            .Int("lease_ttl_ms", 3000)
            .Int("heartbeat_ms", 1000)
            .Bool("auth", false)
            .Uint("version", wire::kVersion);
        std::string reply = wire::EncodeFrame(kOk, out);
        router_.send(identity, zmq::send_flags::sndmore);
        router_.send(zmq::buffer(reply), zmq::send_flags::none);
        continue;
      }
      requests_.fetch_add(1);
    }
  }

  zmq::context_t context_;
  zmq::socket_t router_;
  zmq::socket_t pub_;
  std::string address_;
  std::string pub_address_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

// Advances `clock` in steps of `step_ms` until `future` is ready; false if it is not ready after
// 10 s of real time (the call did not follow the clock).
template <typename T>
bool AdvanceUntilReady(FakeClock& clock, std::future<T>& future, int64_t step_ms) {
  auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (future.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    clock.AdvanceMs(step_ms);
  }
  return true;
}

constexpr int64_t kTenMinutesMs = 10 * 60 * 1000;

TEST(DirectoryClientClockTest, ARequestTimesOutWhenTheInjectedClockPassesItsDeadline) {
  SilentDirectory directory(/*answer_hello=*/true);
  FakeClock clock;
  DirectoryClientOptions options;
  options.directory = directory.address();
  options.request_timeout_ms = kTenMinutesMs;
  options.clock = &clock;
  auto client = DirectoryClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto future = std::async(std::launch::async, [&] { return (*client)->GetSnapshot("demo"); });
  ASSERT_TRUE(AdvanceUntilReady(clock, future, 30'000))
      << "a 10-minute request deadline waited on real time";
  absl::StatusOr<Snapshot> snapshot = future.get();
  ASSERT_EQ(snapshot.status().code(), absl::StatusCode::kDeadlineExceeded) << snapshot.status();
  EXPECT_NE(snapshot.status().message().find("SNAPSHOT"), std::string_view::npos)
      << snapshot.status();
  EXPECT_GE(directory.requests_seen(), 1);
}

TEST(DirectoryClientClockTest, ConnectGivesUpWhenTheInjectedClockPassesItsDeadline) {
  SilentDirectory directory(/*answer_hello=*/false);
  FakeClock clock;
  DirectoryClientOptions options;
  options.directory = directory.address();
  options.request_timeout_ms = kTenMinutesMs;
  options.clock = &clock;
  auto future = std::async(std::launch::async, [&] { return DirectoryClient::Connect(options); });
  ASSERT_TRUE(AdvanceUntilReady(clock, future, 30'000))
      << "a 10-minute HELLO deadline waited on real time";
  auto client = future.get();
  ASSERT_EQ(client.status().code(), absl::StatusCode::kUnavailable) << client.status();
  EXPECT_NE(client.status().message().find("no answer within 600000 ms"), std::string_view::npos)
      << client.status();
}

TEST(DirectoryClientClockTest, AwaitViewGivesUpWhenTheInjectedClockPassesItsDeadline) {
  SilentDirectory directory(/*answer_hello=*/true);
  FakeClock clock;
  DirectoryClientOptions options;
  options.directory = directory.address();
  options.clock = &clock;
  auto client = DirectoryClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto future = std::async(std::launch::async, [&] {
    return (*client)->AwaitView(
        "demo", [](const std::vector<Record>& v) { return !v.empty(); }, kTenMinutesMs);
  });
  ASSERT_TRUE(AdvanceUntilReady(clock, future, 30'000))
      << "a 10-minute AwaitView waited on real time";
  EXPECT_FALSE(future.get());
}

}  // namespace
}  // namespace connex::directory
