// The fixtures of the directory's multi-process tests (directory_process_test.cc and
// directory_process_limits_test.cc): a real connex-directory started per test, clients and
// connexctl runs against it, one directory with a state dir, one with small limits.
#ifndef CONNEX_TESTS_DIRECTORY_PROCESS_FIXTURE_H_
#define CONNEX_TESTS_DIRECTORY_PROCESS_FIXTURE_H_

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
#include "tests/sanitized.h"
#include "zmq.hpp"

namespace connex::testing {

using ::testing::HasSubstr;  // in every test file that includes this

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

  // Starts connex-directory (with `env` added to its environment); a restart reuses the ports of
  // the first start.
  void StartDirectory(std::vector<std::string> extra, std::vector<std::string> env = {}) {
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
    auto p = Subprocess::Start(argv, std::move(env));
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

// A directory with a small per-model limit.
class LimitedDirectoryTest : public StateDirectoryTest {
 protected:
  // --insecure: its raw ZeroMQ readers send no token (what they test is the memory of unread
  // replies, not the token).
  std::vector<std::string> Flags() const override {
    return {"--admin-token-file", admin_file_, "--max-records-per-model", "20", "--insecure"};
  }
};

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

}  // namespace connex::testing

#endif  // CONNEX_TESTS_DIRECTORY_PROCESS_FIXTURE_H_
