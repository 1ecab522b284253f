// DirectoryServer and DirectoryClient together: a watcher's view converges when published events
// are lost, and holders and watchers recover from a directory restart — with a state dir, a restart
// is invisible and epochs never repeat, whatever the clock says.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "connex/base/wait.h"
#include "connex/directory/client.h"
#include "connex/directory/server.h"
#include "connex/directory/server_test_util.h"
#include "gtest/gtest.h"

namespace connex::directory {
namespace {

TEST_F(DirectoryTest, ViewConvergesWhenPublishedEventsAreDropped) {
  StartServer();
  EventLog log;
  auto watcher = Watcher(&log);
  auto holder = Client();
  server_->DropEventsForTest(2);  // lost on the wire for every subscriber
  ASSERT_TRUE(holder->Join(a_, {"tcp://127.0.0.1:1"}).ok());
  ASSERT_TRUE(holder->Join(b_, {"tcp://127.0.0.1:2"}).ok());
  ASSERT_TRUE(WaitUntil([&] { return watcher->View("demo").size() == 2; }, 3000));
  EXPECT_GE(watcher->resnapshots(), 1u);
  // Subscribers still hear of both joins (synthesized from the fresh snapshot; delivered just
  // after the view is updated).
  EXPECT_TRUE(WaitUntil(
      [&] { return log.Has(EventKind::kJoined, a_) && log.Has(EventKind::kJoined, b_); }, 3000));

  // A slow subscriber that misses events in the middle of a stream converges too.
  watcher->DropEventsForTest(1);
  ASSERT_TRUE(holder->Leave(a_).ok());
  ASSERT_TRUE(holder->Join(a_, {"tcp://127.0.0.1:3"}).ok());
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto v = watcher->View("demo");
        return v.size() == 2 && v[0].addresses == std::vector<std::string>{"tcp://127.0.0.1:3"};
      },
      3000));
  auto snapshot = watcher->GetSnapshot("demo");
  ASSERT_TRUE(WaitUntil([&] { return watcher->view_revision() == snapshot->revision; }, 3000));
}

TEST_F(DirectoryTest, DirectoryRestartIsRecovered) {
  StartServer();
  EventLog log;
  auto watcher = Watcher(&log);
  auto holder = Client();
  auto epoch = holder->Join(a_, {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok());
  ASSERT_TRUE(WaitUntil([&] { return watcher->View("demo").size() == 1; }, 3000));
  server_.reset();
  StartServer();  // same ports, empty table, new incarnation
  // The holder's heartbeat finds itself unknown and joins again; the watcher resnapshots.
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto v = watcher->View("demo");
        return v.size() == 1 && v[0].epoch > *epoch;
      },
      5000));
  // The watcher may see the new JOIN before the holder has handled its reply.
  EXPECT_TRUE(WaitUntil([&] { return holder->EpochOf(a_).value_or(0) > *epoch; }, 5000));
}

// Finding 3 of issue 12: epochs were seeded from the wall clock, so a restart after more
// migrations than milliseconds (or after the clock stepped back) handed out epochs again. With a
// state dir they continue from the saved counter, whatever the clock says.
TEST_F(DirectoryTest, EpochsNeverRepeatAcrossRestartsAndClockSteps) {
  std::string dir = ::testing::TempDir() + "/server-test-state-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  FakeClock clock(1'000'000'000);
  DirectoryServerOptions options;
  options.state_dir = dir;
  options.clock = &clock;
  StartServer(options);
  auto holder = Client();
  uint64_t last = 0;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 300; ++i) {
      absl::StatusOr<uint64_t> e;
      // Right after a restart the first request may time out while the client reconnects.
      ASSERT_TRUE(WaitUntil(
          [&] {
            e = holder->Join(a_, {"tcp://127.0.0.1:" + std::to_string(1 + i % 2)});
            return e.ok();
          },
          10000))
          << e.status();
      ASSERT_GT(*e, last) << "round " << round << ", migration " << i;
      last = *e;
    }
    server_.reset();
    clock.AdvanceMs(-100'000'000);  // the clock steps back across the restart
    StartServer(options);
  }
  server_.reset();
  std::filesystem::remove_all(dir);
}

// Finding 3 of issue 12: after a restart every watcher saw every endpoint FAIL and every epoch
// changed. With a state dir the restart is invisible.
TEST_F(DirectoryTest, RestartWithAStateDirIsInvisible) {
  std::string dir = ::testing::TempDir() + "/server-test-invisible-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  DirectoryServerOptions options;
  options.state_dir = dir;
  StartServer(options);
  EventLog log;
  auto watcher = Watcher(&log);
  auto holder = Client();
  auto epoch = holder->Join(a_, {"tcp://127.0.0.1:1"});
  ASSERT_TRUE(epoch.ok());
  ASSERT_TRUE(WaitUntil([&] { return log.Has(EventKind::kJoined, a_, *epoch); }, 3000));
  uint64_t incarnation = server_->incarnation();
  server_.reset();
  StartServer(options);
  ASSERT_NE(server_->incarnation(), incarnation);
  // The watcher resynchronises with the new incarnation (a marker's JOIN reaches it) ...
  auto marker = Client();
  ASSERT_TRUE(marker->Join(b_, {"tcp://127.0.0.1:2"}).ok());
  ASSERT_TRUE(WaitUntil([&] { return log.Has(EventKind::kJoined, b_); }, 5000));
  EXPECT_GE(watcher->resnapshots(), 1u);
  // ... and over two leases nobody sees the holder fail or change epoch.
  EXPECT_FALSE(WaitUntil([&] { return log.Has(EventKind::kFailed, a_); }, 2000));
  EXPECT_EQ(holder->EpochOf(a_), *epoch);
  std::vector<Record> view = watcher->View("demo", 1);
  ASSERT_EQ(view.size(), 2u);
  EXPECT_EQ(view[0].epoch, *epoch);
  server_.reset();
  std::filesystem::remove_all(dir);
}

// Issue 23 (seed 33 of the step-protocol campaign): a SNAPSHOT lost across a directory restart
// left a watcher blind for its request timeout. A tick of a new directory incarnation abandons a
// snapshot asked of the old one and asks again at once.
TEST_F(DirectoryTest, ASnapshotLostAcrossARestartIsAskedAgainAtOnce) {
  std::string dir = ::testing::TempDir() + "/server-test-lost-snapshot-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  DirectoryServerOptions options;
  options.state_dir = dir;
  StartServer(options);
  EventLog log;
  DirectoryClientOptions wo;
  wo.directory = bind_;
  wo.request_timeout_ms = 30'000;  // the blind spot it used to cost
  auto watcher = *DirectoryClient::Connect(wo);
  watcher->Subscribe([&log](const Event& e) { log.Add(e); });
  ASSERT_TRUE(watcher->Watch("demo").ok());
  auto holder = Client();
  // The watcher misses an event, asks for a snapshot, and the directory loses the request ...
  server_->DropSnapshotsForTest(1);
  watcher->DropEventsForTest(1);
  ASSERT_TRUE(holder->Join(a_, {"tcp://127.0.0.1:1"}).ok());
  ASSERT_TRUE(WaitUntil([&] { return server_->snapshots_dropped_for_test() == 1; }, 5000));
  // ... then dies and comes back (another incarnation, the same table).
  const auto restarted = std::chrono::steady_clock::now();
  server_.reset();
  StartServer(options);
  auto marker = Client();
  ASSERT_TRUE(marker->Join(b_, {"tcp://127.0.0.1:2"}).ok());
  EXPECT_TRUE(watcher->AwaitView(
      "demo", [](const std::vector<Record>& v) { return v.size() == 2; }, 10'000))
      << "the watcher waited for the lost snapshot's timeout";
  std::printf("the watcher saw both LIDs %lld ms after the restart\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - restarted)
                                         .count()));
  // Subscribers hear of both (the missed JOIN as a difference of the fresh snapshot).
  EXPECT_TRUE(WaitUntil(
      [&] { return log.Has(EventKind::kJoined, a_) && log.Has(EventKind::kJoined, b_); }, 5000));
  watcher.reset();
  server_.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace connex::directory
