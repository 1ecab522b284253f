// Multi-process tests of the control plane: real connex-directory and connexctl binaries, killed
// with SIGKILL, stopped with SIGSTOP, and fed bad input.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "connex/base/codec.h"
#include "connex/base/subprocess.h"
#include "connex/base/wait.h"
#include "connex/base/zmq_util.h"
#include "connex/directory/client.h"
#include "connex/directory/protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "zmq.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

namespace connex::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kLeaseTtlMs = 1000;

constexpr char kAdminToken[] = "operator-secret-1234";

class DirectoryProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = ::testing::TempDir() + "/directory-process-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(state_);
    std::filesystem::create_directories(state_);
    admin_file_ = state_ + "/admin-token";
    {
      std::ofstream out(admin_file_);
      out << kAdminToken << "\n";
    }
    std::filesystem::permissions(
        admin_file_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    StartDirectory(Flags());
  }
  virtual std::vector<std::string> Flags() const { return {"--admin-token-file", admin_file_}; }
  void TearDown() override { std::filesystem::remove_all(state_); }

  // The environment of an operator's connexctl.
  std::vector<std::string> AdminEnv() const {
    return {"CONNEX_DIRECTORY_ADMIN_TOKEN_FILE=" + admin_file_};
  }

  // Starts connex-directory; a restart reuses the ports of the first start.
  void StartDirectory(std::vector<std::string> extra) {
    std::vector<std::string> argv = {BinDir() + "/connex-directory",
                                     "--bind",
                                     bind_.empty() ? "tcp://127.0.0.1:0" : bind_,
                                     "--pub",
                                     pub_.empty() ? "tcp://127.0.0.1:0" : pub_,
                                     "--lease-ttl-ms",
                                     std::to_string(kLeaseTtlMs),
                                     "--heartbeat-ms",
                                     "200"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Subprocess::Start(argv);
    ASSERT_TRUE(p.has_value());
    directory_.emplace(std::move(*p));
    std::optional<std::string> line = directory_->ReadLine(10000);
    ASSERT_TRUE(line.has_value()) << "connex-directory printed nothing";
    std::smatch m;
    ASSERT_TRUE(std::regex_match(*line, m,
                                 std::regex("listening bind=(tcp://127.0.0.1:[0-9]+) "
                                            "pub=(tcp://127.0.0.1:[0-9]+)")))
        << *line;
    bind_ = m[1];
    pub_ = m[2];
  }

  Subprocess Ctl(std::vector<std::string> args, std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {BinDir() + "/connexctl", "--directory", bind_};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = Subprocess::Start(argv, env, /*capture_stderr=*/true);
    EXPECT_TRUE(p.has_value());
    return std::move(*p);
  }

  // Runs connexctl to completion; returns (exit code, output).
  std::pair<int, std::string> Run(std::vector<std::string> args,
                                  std::vector<std::string> env = {}) {
    Subprocess p = Ctl(std::move(args), std::move(env));
    while (p.ReadLine(10000)) {
    }
    std::optional<int> code = p.Wait(10000);
    return {code.value_or(-1), p.transcript()};
  }

  Subprocess Watcher() {
    Subprocess w = Ctl({"watch"});
    EXPECT_TRUE(w.WaitForLine("# watching", 10000).has_value());
    return w;
  }

  // Starts `connexctl join LID` and returns it with the epoch it printed.
  std::pair<Subprocess, uint64_t> Join(const std::string& lid, const std::string& address,
                                       std::vector<std::string> flags = {},
                                       std::vector<std::string> env = {}) {
    std::vector<std::string> args = {"join", lid, "--address", address};
    args.insert(args.end(), flags.begin(), flags.end());
    Subprocess j = Ctl(args, std::move(env));
    std::optional<std::string> line = j.WaitForLine("joined " + lid, 10000);
    EXPECT_TRUE(line.has_value()) << j.transcript();
    uint64_t epoch = 0;
    if (line) epoch = std::stoull(line->substr(line->find("epoch=") + 6));
    return {std::move(j), epoch};
  }

  std::optional<Subprocess> directory_;
  std::string bind_, pub_;
  std::string state_, admin_file_;
};

TEST_F(DirectoryProcessTest, KilledHolderIsFailedWithinTheLease) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  std::string e = std::to_string(epoch);
  ASSERT_TRUE(watcher.WaitForLine("JOINED demo/g1/s0/r0 epoch=" + e, 5000));
  holder.Signal(SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  std::optional<std::string> failed =
      watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + e, kLeaseTtlMs + 500);
  ASSERT_TRUE(failed.has_value()) << watcher.transcript();
  EXPECT_THAT(*failed, HasSubstr("reason=lease-expired"));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  killed)
                .count();
  RecordProperty("kill_to_failed_ms", std::to_string(ms));
  EXPECT_EQ(holder.Wait(1000), 128 + SIGKILL);
}

TEST_F(DirectoryProcessTest, StoppedHolderIsRefusedAfterItWasReplaced) {
  Subprocess watcher = Watcher();
  auto [old_holder, old_epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  old_holder.Signal(SIGSTOP);
  ASSERT_TRUE(watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + std::to_string(old_epoch),
                                  kLeaseTtlMs + 2000));
  auto [replacement, new_epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:6666");
  EXPECT_GT(new_epoch, old_epoch);
  old_holder.Signal(SIGCONT);
  // Its next heartbeat is refused: it gives the LID up and exits 3.
  std::optional<std::string> lost = old_holder.WaitForLine("lost demo/g1/s0/r0", 5000);
  ASSERT_TRUE(lost.has_value()) << old_holder.transcript();
  EXPECT_THAT(*lost, HasSubstr("superseded by " + std::to_string(new_epoch)));
  EXPECT_EQ(old_holder.Wait(5000), 3);
  // The replacement keeps the LID.
  auto [code, out] = Run({"resolve", "demo", "1"});
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("demo/g1/s0/r0 epoch=" + std::to_string(new_epoch) +
                             " addresses=tcp://127.0.0.1:6666"));
}

TEST_F(DirectoryProcessTest, StoppedHolderComesBackUnderANewEpoch) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  holder.Signal(SIGSTOP);
  ASSERT_TRUE(watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + std::to_string(epoch),
                                  kLeaseTtlMs + 2000));
  holder.Signal(SIGCONT);
  // The evicted epoch is refused; the live process joins again under a new one.
  std::optional<std::string> rejoined = holder.WaitForLine("rejoined demo/g1/s0/r0", 5000);
  ASSERT_TRUE(rejoined.has_value()) << holder.transcript();
  EXPECT_THAT(*rejoined, HasSubstr("previous_epoch=" + std::to_string(epoch)));
  std::optional<std::string> joined = watcher.WaitForLine("JOINED demo/g1/s0/r0", 5000);
  ASSERT_TRUE(joined.has_value());
  EXPECT_THAT(*joined, ::testing::Not(HasSubstr("epoch=" + std::to_string(epoch) + " ")));
  // The old epoch stays fenced.
  auto [code, out] =
      Run({"report-failed", "demo/g1/s0/r0", "--epoch", std::to_string(epoch)}, AdminEnv());
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("not evicted"));
}

TEST_F(DirectoryProcessTest, SigtermLeavesGracefully) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g2/s0/r1", "tcp://127.0.0.1:5555");
  holder.Signal(SIGTERM);
  ASSERT_TRUE(holder.WaitForLine("left demo/g2/s0/r1", 5000));
  EXPECT_EQ(holder.Wait(5000), 0);
  ASSERT_TRUE(watcher.WaitForLine("LEFT demo/g2/s0/r1 epoch=" + std::to_string(epoch), 5000));
}

TEST_F(DirectoryProcessTest, StatusResolveLeaveAndReportFailed) {
  auto [a, ea] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  auto [b, eb] = Join("demo/g1/s0/r1", "tcp://127.0.0.1:5556");
  auto [code, out] = Run({"status"});
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("LID"));
  EXPECT_THAT(out, HasSubstr("demo/g1/s0/r1"));
  auto [jcode, json_text] = Run({"resolve", "demo", "1", "--json"});
  EXPECT_EQ(jcode, 0);
  nlohmann::json records = nlohmann::json::parse(json_text);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["lid"], "demo/g1/s0/r0");
  EXPECT_EQ(records[0]["epoch"], ea);
  EXPECT_GT(records[1]["lease_left_ms"].get<int64_t>(), 0);

  Subprocess watcher = Watcher();
  auto [rcode, rout] = Run({"report-failed", "demo/g1/s0/r0"}, AdminEnv());
  EXPECT_EQ(rcode, 0) << rout;
  EXPECT_THAT(rout, HasSubstr("evicted demo/g1/s0/r0"));
  ASSERT_TRUE(watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + std::to_string(ea), 5000));
  auto [lcode, lout] = Run({"leave", "demo/g1/s0/r1"}, AdminEnv());
  EXPECT_EQ(lcode, 0) << lout;
  ASSERT_TRUE(watcher.WaitForLine("LEFT demo/g1/s0/r1", 5000));
  // The drained holder learns it and stops claiming the LID.
  ASSERT_TRUE(b.WaitForLine("lost demo/g1/s0/r1", 5000)) << b.transcript();
  EXPECT_EQ(b.Wait(5000), 3);
}

// Finding 1 of issue 12: `connexctl join` of a live holder's LID took it over (the holder gave
// up, watchers saw FAILED then JOINED at the impostor's address), and a stranger's `leave` or
// `report-failed` removed a live holder.
TEST_F(DirectoryProcessTest, HijackOfALiveLidIsRefused) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  std::string e = std::to_string(epoch);
  ASSERT_TRUE(watcher.WaitForLine("JOINED demo/g1/s0/r0 epoch=" + e, 5000));
  auto [c1, o1] = Run({"join", "demo/g1/s0/r0", "--address", "tcp://6.6.6.6:666"});
  EXPECT_EQ(c1, 1);
  EXPECT_THAT(o1, HasSubstr("JOIN for demo/g1/s0/r0: held by epoch " + e + " (lease live"));
  auto [c2, o2] = Run({"leave", "demo/g1/s0/r0"});
  EXPECT_EQ(c2, 1);
  // Refused by the client before the directory is asked (a stranger holds no credential of it).
  EXPECT_THAT(o2, HasSubstr("a drain of demo/g1/s0/r0 needs the admin token"));
  auto [c3, o3] = Run({"report-failed", "demo/g1/s0/r0"});
  EXPECT_EQ(c3, 1);
  EXPECT_THAT(o3, HasSubstr("accepted only from a live member of model 'demo'"));
  // Forcing without (or with a wrong) admin token is refused too.
  auto [c4, o4] = Run({"join", "demo/g1/s0/r0", "--address", "tcp://6.6.6.6:666", "--force"});
  EXPECT_EQ(c4, 1);
  EXPECT_THAT(o4, HasSubstr("needs the admin token"));
  auto [c5, o5] = Run({"join", "demo/g1/s0/r0", "--address", "tcp://6.6.6.6:666", "--force"},
                      {"CONNEX_DIRECTORY_ADMIN_TOKEN=guess"});
  EXPECT_EQ(c5, 1);
  EXPECT_THAT(o5, HasSubstr("wrong admin token"));
  // The holder still holds the LID under its epoch, and nobody saw it fail.
  auto [code, out] = Run({"resolve", "demo", "1"});
  EXPECT_EQ(code, 0);
  EXPECT_THAT(out, HasSubstr("demo/g1/s0/r0 epoch=" + e + " addresses=tcp://127.0.0.1:5555"));
  EXPECT_THAT(watcher.transcript(), ::testing::Not(HasSubstr("FAILED")));
  EXPECT_THAT(holder.transcript(), ::testing::Not(HasSubstr("lost")));
}

TEST_F(DirectoryProcessTest, ForcedTakeoverFencesTheHolder) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  auto [taker, new_epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:6666", {"--force"}, AdminEnv());
  EXPECT_GT(new_epoch, epoch);
  ASSERT_TRUE(watcher.WaitForLine("FAILED demo/g1/s0/r0 epoch=" + std::to_string(epoch), 5000));
  ASSERT_TRUE(watcher.WaitForLine("JOINED demo/g1/s0/r0 epoch=" + std::to_string(new_epoch), 5000));
  // The displaced holder's next heartbeat is refused: it says so and exits 3.
  std::optional<std::string> lost = holder.WaitForLine("lost demo/g1/s0/r0", 5000);
  ASSERT_TRUE(lost.has_value()) << holder.transcript();
  EXPECT_THAT(*lost, HasSubstr("superseded by " + std::to_string(new_epoch)));
  EXPECT_EQ(holder.Wait(5000), 3);
  // An admin token on argv does not exist: only a file or the environment.
  auto [c, o] = Run({"--admin-token", kAdminToken, "status"});
  EXPECT_EQ(c, 2);
}

void SendGarbage(const std::string& endpoint) {
  size_t colon = endpoint.rfind(':');
  int port = std::stoi(endpoint.substr(colon + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string junk(65536, '\x5a');
  ssize_t n = write(fd, junk.data(), junk.size());
  (void)n;
  close(fd);
}

TEST_F(DirectoryProcessTest, BadInputGetsClearErrorsAndTheDirectoryKeepsServing) {
  auto [a, ea] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  SendGarbage(bind_);
  SendGarbage(pub_);

  auto [c1, o1] = Run({"join", "demo/g1/s0", "--address", "tcp://x:1"});
  EXPECT_EQ(c1, 2);
  EXPECT_THAT(o1, HasSubstr("LID 'demo/g1/s0': expected 4 parts"));
  auto [c2, o2] = Run({"frobnicate"});
  EXPECT_EQ(c2, 2);
  EXPECT_THAT(o2, HasSubstr("unknown command 'frobnicate'"));
  auto [c3, o3] = Run({"resolve", "demo"});
  EXPECT_EQ(c3, 2);
  EXPECT_THAT(o3, HasSubstr("group is required"));
  auto [c4, o4] = Run({"join", "demo/g1/s0/r9", "--address", "no-scheme"});
  EXPECT_EQ(c4, 2);
  EXPECT_THAT(o4, HasSubstr("not self-describing"));
  auto [c5, o5] = Run({"status", "--timeout-ms", "abc"});
  EXPECT_EQ(c5, 2);

  // The directory survived all of it, with its table intact.
  auto [code, out] = Run({"status", "--json"});
  ASSERT_EQ(code, 0) << out;
  nlohmann::json status = nlohmann::json::parse(out);
  ASSERT_EQ(status["records"].size(), 1u);
  EXPECT_EQ(status["records"][0]["epoch"], ea);
  EXPECT_FALSE(directory_->Wait(0).has_value());  // still running
}

// Finding 4 of issue 12: a heartbeat period above the lease TTL was accepted.
TEST_F(DirectoryProcessTest, HeartbeatAboveTheLeaseIsRefusedAtStart) {
  auto p =
      Subprocess::Start({BinDir() + "/connex-directory", "--bind", "tcp://127.0.0.1:0", "--pub",
                         "tcp://127.0.0.1:0", "--lease-ttl-ms", "500", "--heartbeat-ms", "2000"},
                        {}, /*capture_stderr=*/true);
  ASSERT_TRUE(p.has_value());
  while (p->ReadLine(5000)) {
  }
  EXPECT_EQ(p->Wait(5000), 2);
  EXPECT_THAT(p->transcript(), HasSubstr("--heartbeat-ms 2000"));
  EXPECT_THAT(p->transcript(), HasSubstr("--lease-ttl-ms 500"));
  EXPECT_THAT(p->transcript(), ::testing::Not(HasSubstr("listening")));
}

// Protected mode: a directory on a non-loopback address (here every interface) without a CURVE
// key pair is refused at start, naming both ways out; with --insecure, or with a key pair, it
// starts. A client with the wrong key or none is refused by name (connexctl, exit 1).
TEST_F(DirectoryProcessTest, BeyondLoopbackOnlyWithCurveOrInsecure) {
  const std::string dir = ::testing::TempDir() + "/curve-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (std::string name : {"dir", "stranger"}) {
    auto keygen =
        Subprocess::Start({BinDir() + "/connexctl", "keygen", "--out", dir + "/" + name}, {}, true);
    ASSERT_TRUE(keygen.has_value());
    while (keygen->ReadLine(5000)) {
    }
    ASSERT_EQ(keygen->Wait(5000), 0) << keygen->transcript();
  }
  std::vector<std::string> argv = {BinDir() + "/connex-directory", "--bind", "tcp://0.0.0.0:0",
                                   "--pub", "tcp://127.0.0.1:0"};
  {
    auto p = Subprocess::Start(argv, {"CONNEX_INSECURE=0"}, true);
    ASSERT_TRUE(p.has_value());
    while (p->ReadLine(5000)) {
    }
    EXPECT_EQ(p->Wait(5000), 2);
    EXPECT_THAT(p->transcript(), HasSubstr("refusing to listen on '0.0.0.0'"));
    EXPECT_THAT(p->transcript(), HasSubstr("--insecure"));
    EXPECT_THAT(p->transcript(), HasSubstr("CONNEX_CURVE_KEY_FILE"));
  }
  {
    std::vector<std::string> insecure = argv;
    insecure.push_back("--insecure");
    auto p = Subprocess::Start(insecure, {}, true);
    ASSERT_TRUE(p.has_value());
    EXPECT_TRUE(p->WaitForLine("listening", 10000).has_value()) << p->transcript();
  }
  auto p = Subprocess::Start(argv, {"CONNEX_CURVE_KEY_FILE=" + dir + "/dir.key"}, true);
  ASSERT_TRUE(p.has_value());
  auto line = p->WaitForLine("listening", 10000);
  ASSERT_TRUE(line.has_value()) << p->transcript();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*line, m, std::regex("bind=tcp://0\\.0\\.0\\.0:([0-9]+)")));
  const std::string at = "tcp://127.0.0.1:" + std::string(m[1]);
  std::ifstream pub_file(dir + "/dir.pub");
  std::string dir_pub;
  std::getline(pub_file, dir_pub);
  auto status = [&](std::vector<std::string> env) {
    auto c = Subprocess::Start(
        {BinDir() + "/connexctl", "--directory", at, "--timeout-ms", "2000", "status"}, env, true);
    EXPECT_TRUE(c.has_value());
    while (c->ReadLine(5000)) {
    }
    return std::make_pair(c->Wait(5000).value_or(-1), c->transcript());
  };
  auto [ok_code, ok_out] = status({"CONNEX_CURVE_KEY_FILE=" + dir + "/dir.key"});
  EXPECT_EQ(ok_code, 0) << ok_out;
  auto [none_code, none_out] = status({});
  EXPECT_EQ(none_code, 1);
  EXPECT_THAT(none_out, HasSubstr("the directory requires CURVE"));
  auto [bad_code, bad_out] = status(
      {"CONNEX_CURVE_KEY_FILE=" + dir + "/stranger.key", "CONNEX_DIRECTORY_SERVER_KEY=" + dir_pub});
  EXPECT_EQ(bad_code, 1);
  EXPECT_THAT(bad_out, HasSubstr("not authorized"));
  EXPECT_TRUE(p->WaitForLine("not authorized", 5000).has_value()) << p->transcript();
  std::filesystem::remove_all(dir);
}

TEST_F(DirectoryProcessTest, NoDirectoryIsAClearError) {
  std::vector<std::string> argv = {BinDir() + "/connexctl", "--directory", "tcp://127.0.0.1:1",
                                   "--timeout-ms",          "300",         "status"};
  auto p = Subprocess::Start(argv, {}, true);
  ASSERT_TRUE(p.has_value());
  while (p->ReadLine(5000)) {
  }
  EXPECT_EQ(p->Wait(5000), 1);
  EXPECT_THAT(p->transcript(), HasSubstr("no answer within 300 ms"));
}

// A directory with a state dir, restarted by kill -9.
class StateDirectoryTest : public DirectoryProcessTest {
 protected:
  std::vector<std::string> Flags() const override {
    return {"--admin-token-file", admin_file_, "--state-dir", state_ + "/state"};
  }
  void KillAndRestart() {
    directory_->Signal(SIGKILL);
    ASSERT_EQ(directory_->Wait(5000), 128 + SIGKILL);
    StartDirectory(Flags());
  }
  std::unique_ptr<directory::DirectoryClient> Client(int request_timeout_ms = 1000) {
    // FromEnv: the directory's token, this user's default (connex-directory is secure by
    // default), as every binary reads it.
    directory::DirectoryClientOptions options = *directory::DirectoryClientOptions::FromEnv();
    options.directory = bind_;
    options.request_timeout_ms = request_timeout_ms;
    auto client = directory::DirectoryClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Connects new clients (each Connect is a HELLO round trip) for `duration`, five a second,
  // and returns the slowest round trip: a figure the flood tests print, not a bound they assert
  // (under TSan on two busy cores one HELLO took 1006 ms, past a 1000 ms request timeout), so
  // a probe waits up to 30 s for its answer and only a HELLO never answered fails the test.
  int64_t SlowestHelloMs(std::chrono::seconds duration) {
    int64_t worst = 0;
    const auto end = std::chrono::steady_clock::now() + duration;
    while (std::chrono::steady_clock::now() < end) {
      const auto t0 = std::chrono::steady_clock::now();
      auto probe = Client(/*request_timeout_ms=*/30000);
      EXPECT_NE(probe, nullptr);
      worst = std::max<int64_t>(worst, std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - t0)
                                           .count());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a probe's pace, not a wait
    }
    return worst;
  }
};

// Finding 3 of issue 12: epochs were seeded from the wall clock in milliseconds, so a restart
// after more migrations than milliseconds handed out epochs a second time (397 178 of 400 000).
// Here each round migrates faster than one epoch per millisecond, then the directory is killed.
TEST_F(StateDirectoryTest, EpochsNeverRepeatAcrossKillAndRestart) {
  auto holder = Client();
  ASSERT_NE(holder, nullptr);
  const Lid lid{"demo", 1, 0, 0};
  std::set<uint64_t> seen;
  uint64_t last = 0;
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 400; ++i) {
      absl::StatusOr<uint64_t> e;
      // Right after a restart a request may time out while the client reconnects.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      do {
        e = holder->Join(lid, {"tcp://127.0.0.1:" + std::to_string(1 + i % 2)});
      } while (!e.ok() && std::chrono::steady_clock::now() < deadline);
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_GT(*e, last) << "round " << round << ", migration " << i;
      ASSERT_TRUE(seen.insert(*e).second);
      last = *e;
    }
    KillAndRestart();
  }
  RecordProperty("epochs", std::to_string(seen.size()));
}

// Finding 3 of issue 12: after kill -9 and a restart of the directory every watcher saw FAILED
// for every endpoint and every epoch changed (mid-generation: 3 failovers, 3 re-prefills). With
// a state dir the restart is invisible: no FAILED, the holder keeps its epoch.
TEST_F(StateDirectoryTest, KillAndRestartIsInvisibleToWatchersAndHolders) {
  Subprocess watcher = Watcher();
  auto [holder, epoch] = Join("demo/g1/s0/r0", "tcp://127.0.0.1:5555");
  std::string e = std::to_string(epoch);
  ASSERT_TRUE(watcher.WaitForLine("JOINED demo/g1/s0/r0 epoch=" + e, 5000));
  KillAndRestart();
  // The watcher follows the new incarnation: a marker's JOIN after the restart reaches it (any
  // FAILED synthesized from its fresh snapshot would come before).
  auto [marker, marker_epoch] = Join("demo/g1/s0/r9", "tcp://127.0.0.1:5559");
  EXPECT_GT(marker_epoch, epoch);
  ASSERT_TRUE(watcher.WaitForLine("JOINED demo/g1/s0/r9", 5000)) << watcher.transcript();
  // Over two leases the holder's heartbeats keep its restored record alive.
  EXPECT_FALSE(watcher.WaitForLine("FAILED", 2 * kLeaseTtlMs + 500).has_value())
      << watcher.transcript();
  auto [code, out] = Run({"status", "--json"});
  ASSERT_EQ(code, 0) << out;
  nlohmann::json status = nlohmann::json::parse(out);
  ASSERT_EQ(status["records"].size(), 2u);
  EXPECT_EQ(status["records"][0]["lid"], "demo/g1/s0/r0");
  EXPECT_EQ(status["records"][0]["epoch"], epoch);
  EXPECT_THAT(holder.transcript(), ::testing::Not(HasSubstr("rejoined")));
  EXPECT_THAT(holder.transcript(), ::testing::Not(HasSubstr("lost")));
  EXPECT_FALSE(holder.Wait(0).has_value());  // still running, still holding
  RecordProperty("watcher", watcher.transcript());
}

// A directory with a small per-model limit.
class LimitedDirectoryTest : public StateDirectoryTest {
 protected:
  // --insecure: its raw ZeroMQ readers send no token (what they test is the memory of unread
  // replies, not the token).
  std::vector<std::string> Flags() const override {
    return {"--admin-token-file", admin_file_, "--max-records-per-model", "20", "--insecure"};
  }
};

// Finding 2 of issue 12: 520 maximal records in model `junk` made `Watch("prod")` and
// `GetSnapshot(prod)` fail. Now `junk` hits its own limit and `prod` carries on.
TEST_F(LimitedDirectoryTest, AFloodOfOneModelLeavesAnotherWorking) {
  auto flooder = Client();
  ASSERT_NE(flooder, nullptr);
  std::map<std::string, std::string> large = {{"blob", std::string(4000, 'j')}};
  for (uint32_t r = 0; r < 20; ++r) {
    ASSERT_TRUE(flooder->Join(Lid{"junk", 0, 0, r}, {"tcp://127.0.0.1:1"}, large).ok());
  }
  absl::StatusOr<uint64_t> refused = flooder->Join(Lid{"junk", 0, 0, 20}, {"tcp://127.0.0.1:1"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("JOIN for junk/g0/s0/r20: model 'junk' has 20 records, the limit"));
  auto [holder, epoch] = Join("prod/g0/s0/r0", "tcp://127.0.0.1:5555");
  EXPECT_GT(epoch, 0u);
  auto [code, out] = Run({"resolve", "prod", "0"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("prod/g0/s0/r0 epoch=" + std::to_string(epoch)));
  auto watcher = Client();
  ASSERT_TRUE(watcher->Watch("prod").ok());
  EXPECT_EQ(watcher->View("prod").size(), 1u);
}

TEST_F(DirectoryProcessTest, OversizedTableLimitsAreRefusedAtStart) {
  auto p = Subprocess::Start({BinDir() + "/connex-directory", "--bind", "tcp://127.0.0.1:0",
                              "--pub", "tcp://127.0.0.1:0", "--max-records", "100000"},
                             {}, /*capture_stderr=*/true);
  ASSERT_TRUE(p.has_value());
  while (p->ReadLine(5000)) {
  }
  EXPECT_EQ(p->Wait(5000), 2);
  EXPECT_THAT(p->transcript(), HasSubstr("--max-records 100000"));
  EXPECT_THAT(p->transcript(), HasSubstr("--max-record-bytes 8192"));
}

// Resident memory of process `pid` in KiB (VmRSS), or -1.
int64_t RssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Finding 2 of issue 12: one SIGSTOPped watcher plus 3000 re-joins of a large record grew the
// directory from 8 MB to 394 MB (up to 100 000 queued events per slow subscriber). Now a
// subscriber's backlog is bounded (kPubHighWaterMark events of bounded size); it resynchronises
// from a snapshot when it reads again.
TEST_F(LimitedDirectoryTest, AStoppedWatcherLeavesTheDirectoryMemoryBounded) {
  Subprocess stopped = Watcher();
  stopped.Signal(SIGSTOP);
  auto holder = Client();
  ASSERT_NE(holder, nullptr);
  const Lid lid{"demo", 1, 0, 0};
  std::map<std::string, std::string> large = {{"a", std::string(3900, 'a')},
                                              {"b", std::string(3900, 'b')}};
  ASSERT_TRUE(holder->Join(lid, {"tcp://127.0.0.1:1"}, large).ok());
  int64_t before = RssKib(directory_->pid());
  uint64_t last = 0;
  for (int i = 0; i < 8000; ++i) {
    auto e = holder->Join(lid, {"tcp://127.0.0.1:" + std::to_string(2 + i % 2)}, large);
    ASSERT_TRUE(e.ok()) << e.status();
    last = *e;
  }
  int64_t after = RssKib(directory_->pid());
  std::cout << "directory RSS: " << before << " KiB before, " << after
            << " KiB after 8000 MIGRATED events of ~8 KB with a stopped watcher\n";
  RecordProperty("rss_before_kib", std::to_string(before));
  RecordProperty("rss_after_kib", std::to_string(after));
  // Under a sanitizer, freed memory sits in its quarantine (ASan's is 256 MB): RSS says nothing
  // about the directory's own bound there, so only the figure is printed.
  if (!kSanitized) {
    EXPECT_LT(after - before, 32 * 1024);
  }
  // Woken up, the watcher catches up from a snapshot.
  stopped.Signal(SIGCONT);
  auto [code, out] = Run({"resolve", "demo", "1"});
  EXPECT_THAT(out, HasSubstr("epoch=" + std::to_string(last)));
  EXPECT_TRUE(stopped.WaitForLine("epoch=" + std::to_string(last), 10000).has_value());
}

// Finding 2 of issue 12: expensive but legal JOINs from 100 connections delayed HELLO by 3.7 s
// and expired a live holder's lease. Now 32 connections that migrate maximal records as fast as
// they can (each migration an event and, with the state dir, a write of the table) expire no
// lease of a live holder, and a new client still gets its HELLO answered promptly (printed).
TEST_F(StateDirectoryTest, AFloodOfExpensiveJoinsExpiresNoLease) {
  auto holder = Client();
  ASSERT_NE(holder, nullptr);
  const Lid lid{"prod", 1, 0, 0};
  absl::StatusOr<uint64_t> epoch = holder->Join(lid, {"tcp://127.0.0.1:5555"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  auto watcher = Client();
  std::atomic<int> failed{0};
  watcher->Subscribe([&](const directory::Event& e) {
    if (e.record.lid == lid && e.kind != directory::EventKind::kJoined) failed.fetch_add(1);
  });
  ASSERT_TRUE(watcher->Watch("prod").ok());

  std::map<std::string, std::string> large = {{"a", std::string(3900, 'a')},
                                              {"b", std::string(3900, 'b')}};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> joins{0};
  std::vector<std::thread> flood;
  for (uint32_t t = 0; t < 32; ++t) {
    flood.emplace_back([&, t] {
      auto c = Client();
      if (c == nullptr) return;
      for (int i = 0; !stop.load(); ++i) {
        if (c->Join(Lid{"flood", 1, 0, t}, {"tcp://127.0.0.1:" + std::to_string(1 + i % 2)}, large)
                .ok()) {
          joins.fetch_add(1);
        }
      }
    });
  }
  const int64_t worst_hello_ms = SlowestHelloMs(std::chrono::seconds(4));
  stop.store(true);
  for (std::thread& t : flood) t.join();
  std::cout << "flood: " << joins.load() << " maximal migrations from 32 connections in 4 s; "
            << "slowest HELLO " << worst_hello_ms << " ms\n";
  RecordProperty("flood_joins", std::to_string(joins.load()));
  RecordProperty("worst_hello_ms", std::to_string(worst_hello_ms));
  EXPECT_GT(joins.load(), 0u);
  EXPECT_EQ(failed.load(), 0) << "the live holder's lease expired under the flood";
  EXPECT_EQ(holder->EpochOf(lid), std::optional<uint64_t>(*epoch));
  auto snapshot = watcher->GetSnapshot("prod");
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->records.size(), 1u);
  EXPECT_EQ(snapshot->records[0].epoch, *epoch);
}

// Finding 2 of issue 12: after 7 rounds of 18 000 connect+close, the directory's RSS stayed at
// 1.2 GB. Rounds of connections that send a HELLO (and an expensive SNAPSHOT of a table of
// maximal records) and close without reading leave the RSS bounded (printed per round).
TEST_F(LimitedDirectoryTest, ConnectionsThatCloseGiveTheirMemoryBack) {
  auto holder = Client();
  ASSERT_NE(holder, nullptr);
  std::map<std::string, std::string> large = {{"a", std::string(3900, 'a')},
                                              {"b", std::string(3900, 'b')}};
  for (uint32_t r = 0; r < 20; ++r) {
    ASSERT_TRUE(holder->Join(Lid{"demo", 1, 0, r}, {"tcp://127.0.0.1:1"}, large).ok());
  }
  wire::MapBuilder hello_body;
  hello_body.Uint("id", 1);
  const std::string hello = wire::EncodeFrame(directory::kHello, hello_body);
  wire::MapBuilder snapshot_body;
  snapshot_body.Uint("id", 2);
  const std::string snapshot = wire::EncodeFrame(directory::kSnapshot, snapshot_body);
  std::vector<int64_t> rss;
  // Under a sanitizer every snapshot costs several times more: fewer rounds.
  const int batches = 5;
  for (int round = 0; round < (kSanitized ? 2 : 4); ++round) {
    for (int batch = 0; batch < batches; ++batch) {
      // 200 at a time: a context's end waits until their requests are out (linger), and frees
      // their descriptors.
      zmq::context_t context(1);
      std::vector<zmq::socket_t> dealers;
      for (int i = 0; i < 200; ++i) {
        zmq::socket_t& dealer = dealers.emplace_back(context, zmq::socket_type::dealer);
        dealer.set(zmq::sockopt::linger, 2000);
        dealer.connect(bind_);
        dealer.send(zmq::buffer(hello), zmq::send_flags::dontwait);
        dealer.send(zmq::buffer(snapshot), zmq::send_flags::dontwait);
      }
      dealers.clear();
    }
    // The directory has served them all once a request of ours gets its answer after them.
    ASSERT_TRUE(WaitUntil([&] { return holder->GetSnapshot("demo").ok(); }, 30000));
    rss.push_back(RssKib(directory_->pid()));
  }
  std::cout << "directory RSS after each round of " << batches * 200
            << " connect+HELLO+SNAPSHOT+close (KiB):";
  for (int64_t r : rss) std::cout << " " << r;
  std::cout << "\n";
  RecordProperty("rss_first_round_kib", std::to_string(rss.front()));
  RecordProperty("rss_last_round_kib", std::to_string(rss.back()));
  // Bounded, not growing with the rounds (the allocator keeps some of what was freed: the figure
  // moves between rounds, it does not climb).
  if (!kSanitized) {
    for (int64_t r : rss) EXPECT_LT(r - rss.front(), 64 * 1024);
  }
  auto [code, out] = Run({"resolve", "demo", "1"});
  EXPECT_EQ(code, 0) << out;
}

// A table of 20 maximal records: every snapshot of it is about 160 KB.
void JoinLargeTable(directory::DirectoryClient& holder) {
  std::map<std::string, std::string> large = {{"a", std::string(3900, 'a')},
                                              {"b", std::string(3900, 'b')}};
  for (uint32_t r = 0; r < 20; ++r) {
    ASSERT_TRUE(holder.Join(Lid{"demo", 1, 0, r}, {"tcp://127.0.0.1:1"}, large).ok());
  }
}

std::string SnapshotRequest(uint64_t id) {
  wire::MapBuilder body;
  body.Uint("id", id);
  return wire::EncodeFrame(directory::kSnapshot, body);
}

// Finding 2 of issue 12: two clients that sent 1000 SNAPSHOT requests each and never read grew
// the directory from 12 MB to 2.04 GB: ZeroMQ queues a connection's replies by message (1000),
// not by byte. Now a connection with more than kMaxUnreadBytesPerConnection of unread replies has
// its SNAPSHOTs refused until it reads, so it costs the directory a few MB (printed), and once it
// has read it is served again.
TEST_F(LimitedDirectoryTest, AClientThatNeverReadsCostsTheDirectoryBoundedMemory) {
  auto holder = Client();
  ASSERT_NE(holder, nullptr);
  JoinLargeTable(*holder);
  const int64_t before = RssKib(directory_->pid());
  zmq::context_t context(1);
  std::vector<zmq::socket_t> readers_never;
  constexpr int kConnections = 2;
  constexpr int kRequests = 1000;
  for (int c = 0; c < kConnections; ++c) {
    zmq::socket_t& dealer = readers_never.emplace_back(context, zmq::socket_type::dealer);
    // It takes in one reply and a small kernel buffer's worth, then reads no more.
    dealer.set(zmq::sockopt::rcvhwm, 1);
    dealer.set(zmq::sockopt::rcvbuf, 16 * 1024);
    dealer.set(zmq::sockopt::sndhwm, 0);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(bind_);
    for (int i = 1; i <= kRequests; ++i) {
      ASSERT_TRUE(dealer.send(zmq::buffer(SnapshotRequest(i)), zmq::send_flags::dontwait));
    }
  }
  // The directory has taken their requests in once another client's snapshot comes after them;
  // meanwhile and for a second more, its RSS is sampled.
  int64_t peak = before;
  auto sample = [&] { peak = std::max(peak, RssKib(directory_->pid())); };
  ASSERT_TRUE(WaitUntil(
      [&] {
        sample();
        return holder->GetSnapshot("demo").ok();
      },
      30000));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < end) {
    sample();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a sampling pace
  }
  std::cout << "directory RSS: " << before << " KiB before, peak " << peak << " KiB with "
            << kConnections << " connections that sent " << kRequests
            << " SNAPSHOTs of a 160 KB table each and read nothing\n";
  RecordProperty("rss_before_kib", std::to_string(before));
  RecordProperty("rss_peak_kib", std::to_string(peak));
  if (!kSanitized) {
    EXPECT_LT(peak - before, 48 * 1024);  // it was 2 x 1000 x 160 KB = 320 MB
  }
  // A heartbeating holder kept its records meanwhile, and others are served.
  auto [code, out] = Run({"resolve", "demo", "1"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("demo/g1/s0/r19"));

  // The first reader reads now: some snapshots, then refusals naming why; what did not fit
  // ZeroMQ's queue was dropped (a client times out and asks again).
  zmq::socket_t& dealer = readers_never.front();
  int snapshots = 0;
  int refused = 0;
  std::string refusal;
  zmq::message_t reply;
  while (true) {
    zmq::pollitem_t items[] = {{dealer.handle(), 0, ZMQ_POLLIN, 0}};
    if (zmq::poll(items, 1, std::chrono::milliseconds(2000)) == 0) break;  // the backlog is read
    if (!dealer.recv(reply, zmq::recv_flags::dontwait).has_value()) continue;
    absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(AsView(reply));
    ASSERT_TRUE(frame.ok()) << frame.status();
    if (frame->type == directory::kOk) {
      ++snapshots;
    } else {
      ++refused;
      refusal = frame->body.StrOr("message", "").value_or("");
    }
  }
  std::cout << "the reader got " << snapshots << " snapshots and " << refused << " refusals\n";
  EXPECT_GE(snapshots, 1);
  EXPECT_GE(refused, 1);
  EXPECT_THAT(refusal, HasSubstr("of earlier replies to this connection are unread"));
  // Having read, it is served again.
  ASSERT_TRUE(dealer.send(zmq::buffer(SnapshotRequest(999999)), zmq::send_flags::dontwait));
  bool served = false;
  ASSERT_TRUE(WaitUntil(
      [&] {
        while (dealer.recv(reply, zmq::recv_flags::dontwait).has_value()) {
          absl::StatusOr<wire::Frame> frame = wire::DecodeFrame(AsView(reply));
          if (frame.ok() && frame->body.UintOr("id", 0).value_or(0) == 999999) {
            served = frame->type == directory::kOk;
            return true;
          }
        }
        return false;
      },
      10000));
  EXPECT_TRUE(served);
}

// Finding 2 of issue 12: 1000 concurrent 160 KB SNAPSHOTs (under ASan) kept a holder's heartbeat
// waiting past its 1000 ms lease. Snapshots are now served after each turn's cheap requests
// within a time budget, and encoded once per revision: clients that ask for snapshots as fast as
// they can, and connections that ask and never read, expire no lease and delay no HELLO much
// (printed).
TEST_F(LimitedDirectoryTest, AFloodOfSnapshotsExpiresNoLease) {
  auto holder = Client();
  ASSERT_NE(holder, nullptr);
  JoinLargeTable(*holder);
  const Lid lid{"prod", 1, 0, 0};
  absl::StatusOr<uint64_t> epoch = holder->Join(lid, {"tcp://127.0.0.1:5555"});
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  auto watcher = Client();
  std::atomic<int> failed{0};
  watcher->Subscribe([&](const directory::Event& e) {
    if (e.kind == directory::EventKind::kFailed) failed.fetch_add(1);
  });
  ASSERT_TRUE(watcher->Watch("prod").ok());

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> served{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 8; ++t) {
    flood.emplace_back([&] {
      // Pipelined: 64 requests out at a time on one connection, every reply read.
      zmq::context_t context(1);
      zmq::socket_t dealer(context, zmq::socket_type::dealer);
      dealer.set(zmq::sockopt::linger, 0);
      dealer.connect(bind_);
      uint64_t id = 0;
      int outstanding = 0;
      zmq::message_t reply;
      while (!stop.load()) {
        while (outstanding < 64 &&
               dealer.send(zmq::buffer(SnapshotRequest(++id)), zmq::send_flags::dontwait)) {
          ++outstanding;
        }
        zmq::pollitem_t items[] = {{dealer.handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 1, std::chrono::milliseconds(100));
        while (dealer.recv(reply, zmq::recv_flags::dontwait).has_value()) {
          --outstanding;
          served.fetch_add(1);
        }
      }
    });
  }
  // And connections that ask and never read.
  zmq::context_t context(1);
  std::vector<zmq::socket_t> silent;
  for (int c = 0; c < 200; ++c) {
    zmq::socket_t& dealer = silent.emplace_back(context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::rcvhwm, 1);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(bind_);
    for (int i = 1; i <= 5; ++i)
      dealer.send(zmq::buffer(SnapshotRequest(i)), zmq::send_flags::dontwait);
  }
  const int64_t worst_hello_ms = SlowestHelloMs(std::chrono::seconds(4));
  stop.store(true);
  for (std::thread& t : flood) t.join();
  std::cout << "flood: " << served.load() << " snapshots of a 160 KB table read by 8 "
            << "pipelining connections in 4 s, beside 200 that never read; slowest HELLO "
            << worst_hello_ms << " ms\n";
  RecordProperty("snapshots_served", std::to_string(served.load()));
  RecordProperty("worst_hello_ms", std::to_string(worst_hello_ms));
  EXPECT_GT(served.load(), 0u);
  EXPECT_EQ(failed.load(), 0) << "a live holder's lease expired under the flood";
  EXPECT_EQ(holder->EpochOf(lid), std::optional<uint64_t>(*epoch));
  EXPECT_EQ(holder->EpochOf(Lid{"demo", 1, 0, 19}).has_value(), true);
}

// Issue 23: with the default directory (no token), a stranger that JOINed any free LID became a
// "member" (its reports evicted live stages, it was routed steps). Out of the box connex-directory
// requires this user's default token, which it makes on its first start ($CONNEX_HOME, else
// ~/.connex); every client of the user reads it; `--insecure` serves anyone who can reach it.
TEST(SecureByDefaultTest, TheDefaultDirectoryRequiresTheTokenItMakesOnFirstStart) {
  const std::string root = ::testing::TempDir() + "/secure-default-" + std::to_string(getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::string home = root + "/home", stranger = root + "/stranger";
  auto start = [](std::vector<std::string> extra, const std::string& connex_home) {
    std::vector<std::string> argv = {BinDir() + "/connex-directory", "--bind", "tcp://127.0.0.1:0",
                                     "--pub", "tcp://127.0.0.1:0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Subprocess::Start(argv, {"CONNEX_HOME=" + connex_home});
    EXPECT_TRUE(p.has_value());
    std::optional<std::string> line = p->WaitForLine("listening", 10000);
    EXPECT_TRUE(line.has_value());
    std::smatch m;
    std::string bind;
    if (line && std::regex_search(*line, m, std::regex("bind=(tcp://[0-9.:]+)"))) bind = m[1];
    return std::make_pair(std::move(*p), bind);
  };
  auto ctl = [](const std::string& bind, std::vector<std::string> args,
                const std::string& connex_home) {
    std::vector<std::string> argv = {BinDir() + "/connexctl", "--directory", bind};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p = Subprocess::Start(argv, {"CONNEX_HOME=" + connex_home}, true);
    EXPECT_TRUE(p.has_value());
    while (p->ReadLine(10000)) {
    }
    return std::make_pair(p->Wait(10000).value_or(-1), p->transcript());
  };
  std::string token;
  {
    auto [directory, bind] = start({}, home);
    const std::string file = home + "/directory.token";
    ASSERT_TRUE(std::filesystem::exists(file));
    EXPECT_EQ(std::filesystem::status(file).permissions(),
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    EXPECT_EQ(std::filesystem::status(home).permissions(), std::filesystem::perms::owner_all);
    std::ifstream(file) >> token;
    EXPECT_GE(token.size(), 32u);
    // A stranger (no token) can neither join nor read the table.
    auto [refused, why] = ctl(bind, {"report-failed", "demo/g1/s0/r0"}, stranger);
    EXPECT_EQ(refused, 1) << why;
    EXPECT_THAT(why, HasSubstr("requires a token"));
    auto [unread, why2] = ctl(bind, {"status"}, stranger);
    EXPECT_EQ(unread, 1) << why2;
    // This user's clients read the default token.
    auto [ok, table] = ctl(bind, {"status"}, home);
    EXPECT_EQ(ok, 0) << table;
  }
  {
    // A second start keeps the token (clients and stages that run on keep working).
    auto [directory, bind] = start({}, home);
    std::string again;
    std::ifstream(home + "/directory.token") >> again;
    EXPECT_EQ(again, token);
    EXPECT_EQ(ctl(bind, {"status"}, home).first, 0);
  }
  {
    // --insecure: no token, anyone who can reach it is served (and no token file is made).
    auto [directory, bind] = start({"--insecure"}, stranger);
    auto [ok, table] = ctl(bind, {"status"}, stranger);
    EXPECT_EQ(ok, 0) << table;
    EXPECT_FALSE(std::filesystem::exists(stranger + "/directory.token"));
  }
  std::filesystem::remove_all(root);
}

// Issue 23: the directory kept the memory of a connection storm for good (8.6 -> 164 MB). After a
// storm it gives the freed heap back to the system within a few seconds.
TEST_F(LimitedDirectoryTest, AConnectionStormsMemoryIsGivenBack) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator keeps freed memory its own way (not glibc's heap)";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "a sanitizer's allocator keeps freed memory its own way (not glibc's heap)";
#endif
#endif
  auto rss_mb = [&] {
    std::ifstream status("/proc/" + std::to_string(directory_->pid()) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
    }
    return 0.0;
  };
  const double before = rss_mb();
  {
    zmq::context_t context(1);
    context.set(zmq::ctxopt::max_sockets, 4096);
    std::vector<zmq::socket_t> dealers;
    const std::string junk(16000, '\x93');  // refused as undecodable, after it was read
    for (int i = 0; i < 500; ++i) {
      dealers.emplace_back(context, zmq::socket_type::dealer);
      dealers.back().set(zmq::sockopt::linger, 0);
      dealers.back().connect(bind_);
    }
    for (int k = 0; k < 20; ++k) {
      for (auto& d : dealers) (void)d.send(zmq::buffer(junk), zmq::send_flags::dontwait);
    }
    ASSERT_TRUE(WaitUntil([&] { return rss_mb() > before + 4; }, 10'000))
        << "the storm did not reach the directory";
  }
  const double peak = rss_mb();
  ASSERT_TRUE(WaitUntil([&] { return rss_mb() < before + 4; }, 20'000))
      << "kept " << rss_mb() << " MB after the storm (" << before << " MB before)";
  std::printf(
      "a storm of 500 connections x 20 junk requests of 16 KB: RSS %.1f -> %.1f MB, "
      "%.1f MB after\n",
      before, peak, rss_mb());
}

// Issue 23: 100 connections of invalid 1 MiB JOINs (each refused, but after parsing) pushed a new
// client's HELLO to ~17 s. A request larger than any valid one is dropped by ZeroMQ before the
// loop reads it: the directory answers others as before (the time is printed).
TEST_F(LimitedDirectoryTest, AFloodOfOversizedJunkDelaysNobody) {
  zmq::context_t context(1);
  context.set(zmq::ctxopt::max_sockets, 4096);
  std::vector<zmq::socket_t> flood;
  const std::string junk(1 << 20, '\x93');
  for (int i = 0; i < 100; ++i) {
    flood.emplace_back(context, zmq::socket_type::dealer);
    flood.back().set(zmq::sockopt::linger, 0);
    flood.back().connect(bind_);
    for (int k = 0; k < 3; ++k)
      (void)flood.back().send(zmq::buffer(junk), zmq::send_flags::dontwait);
  }
  std::vector<int64_t> ms;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto [code, out] = Run({"status"});
    ms.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count());
    EXPECT_EQ(code, 0) << out;
  }
  std::printf(
      "connexctl status (connect, HELLO, SNAPSHOT) while 100 connections send 3 MiB of "
      "junk each: %lld, %lld, %lld, %lld, %lld ms\n",
      static_cast<long long>(ms[0]), static_cast<long long>(ms[1]), static_cast<long long>(ms[2]),
      static_cast<long long>(ms[3]), static_cast<long long>(ms[4]));
}

// A directory that requires a token, read from a file (as connexctl may read it too).
class TokenDirectoryTest : public DirectoryProcessTest {
 protected:
  std::vector<std::string> Flags() const override {
    std::string token_file = state_ + "/token";
    {
      std::ofstream out(token_file);
      out << "s3cret\n";
    }
    std::filesystem::permissions(
        token_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    return {"--token-file", token_file};
  }
};

TEST_F(TokenDirectoryTest, WrongTokenIsRefusedAndRightTokenWorks) {
  // A client with no token at all (no default one in its CONNEX_HOME either).
  const std::string no_home = "CONNEX_HOME=" + state_ + "/no-home";
  auto [c1, o1] = Run({"join", "demo/g1/s0/r0", "--address", "tcp://127.0.0.1:1"}, {no_home});
  EXPECT_EQ(c1, 1);
  EXPECT_THAT(o1, HasSubstr("requires a token"));
  auto [c2, o2] = Run({"report-failed", "demo/g1/s0/r0"}, {"CONNEX_DIRECTORY_TOKEN=nope"});
  EXPECT_EQ(c2, 1);
  EXPECT_THAT(o2, HasSubstr("wrong directory token"));
  // A secret on the command line (where ps shows it) is a usage error naming the ways in.
  auto [c6, o6] = Run({"--token", "s3cret", "status"});
  EXPECT_EQ(c6, 2);
  EXPECT_THAT(o6, HasSubstr("never taken from the command line"));
  EXPECT_THAT(o6, HasSubstr("--token-file FILE or CONNEX_DIRECTORY_TOKEN"));
  Subprocess j = Ctl({"join", "demo/g1/s0/r0", "--address", "tcp://127.0.0.1:1"},
                     {"CONNEX_DIRECTORY_TOKEN=s3cret"});
  ASSERT_TRUE(j.WaitForLine("joined demo/g1/s0/r0", 5000)) << j.transcript();
  // The secret may come from a file instead of argv (where ps shows it).
  auto [c5, o5] = Run({"--token-file", state_ + "/token", "status"});
  EXPECT_EQ(c5, 0) << o5;
  EXPECT_THAT(o5, HasSubstr("demo/g1/s0/r0"));
  // Reading the table needs the token too.
  auto [c3, o3] = Run({"status"}, {no_home});
  EXPECT_EQ(c3, 1);
  EXPECT_THAT(o3, HasSubstr("SNAPSHOT: this directory requires a token"));
  auto [c4, o4] = Run({"status"}, {"CONNEX_DIRECTORY_TOKEN=s3cret"});
  EXPECT_EQ(c4, 0);
  EXPECT_THAT(o4, HasSubstr("demo/g1/s0/r0"));
}

}  // namespace
}  // namespace connex::testing
