#include "connex/base/logging.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "connex/base/access_log.h"
#include "connex/base/log_sink.h"
#include "connex/base/logging_spdlog.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex {
namespace {

using ::testing::HasSubstr;

TEST(LoggingTest, ParsesEveryDocumentedLevel) {
  EXPECT_EQ(ParseLogLevel("trace").value(), spdlog::level::trace);
  EXPECT_EQ(ParseLogLevel("debug").value(), spdlog::level::debug);
  EXPECT_EQ(ParseLogLevel("info").value(), spdlog::level::info);
  EXPECT_EQ(ParseLogLevel("warn").value(), spdlog::level::warn);
  EXPECT_EQ(ParseLogLevel("error").value(), spdlog::level::err);
  EXPECT_EQ(ParseLogLevel("off").value(), spdlog::level::off);
}

TEST(LoggingTest, AnUnknownLevelIsAnErrorNotOff) {
  for (const char* bad : {"bogus", "", "INFO", "warning", "of"}) {
    absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel(bad);
    ASSERT_FALSE(level.ok()) << bad;
    EXPECT_EQ(level.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(level.status().message(), HasSubstr(kLogLevelNames));
  }
}

TEST(AccessLogTest, ALineIsKeyValuesInTextAndMembersInJson) {
  const std::string text = AccessLine(
      {{"id", "cmpl-7"}, {"status", 200}, {"latency_s", 0.25}, {"error", "bad \"x\" here"}},
      /*json=*/false);
  EXPECT_EQ(text, R"(access id=cmpl-7 status=200 latency_s=0.25 error="bad \"x\" here")");
  const std::string json =
      AccessLine({{"id", "cmpl-7"}, {"status", 200}, {"latency_s", 0.25}, {"error", "line\nbreak"}},
                 /*json=*/true);
  nlohmann::json parsed = nlohmann::json::parse("{" + json + "}");
  EXPECT_EQ(parsed["id"], "cmpl-7");
  EXPECT_EQ(parsed["status"], 200);
  EXPECT_DOUBLE_EQ(parsed["latency_s"].get<double>(), 0.25);
  EXPECT_EQ(parsed["error"], "line\nbreak");
}

// A pipe whose reading end the test reads when it chooses.
struct Pipe {
  Pipe() {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    read_fd = fds[0];
    write_fd = fds[1];
  }
  ~Pipe() {
    if (read_fd >= 0) close(read_fd);
    if (write_fd >= 0) close(write_fd);
  }
  // Reads until the writing end is closed.
  std::string ReadToEnd() {
    std::string out;
    char buf[65536];
    for (ssize_t n; (n = read(read_fd, buf, sizeof buf)) > 0;) out.append(buf, n);
    return out;
  }
  int read_fd = -1;
  int write_fd = -1;
};

std::shared_ptr<spdlog::logger> LoggerOver(std::shared_ptr<internal::NonBlockingSink> sink) {
  auto logger = std::make_shared<spdlog::logger>("test", std::move(sink));
  logger->set_pattern("%l %v");
  return logger;
}

TEST(NonBlockingSinkTest, AReaderThatNeverReadsDoesNotBlockTheLoggerAndEveryLossIsReported) {
  Pipe pipe;
  auto sink = std::make_shared<internal::NonBlockingSink>(pipe.write_fd, 64 << 10, false);
  auto logger = LoggerOver(sink);
  constexpr int kLines = 20000;  // ~1.5 MB: many times the pipe's buffer and the queue
  auto logged = std::async(std::launch::async, [&] {
    for (int i = 0; i < kLines; ++i) logger->info("line {} {}", i, std::string(60, 'x'));
  });
  // Nobody reads the pipe yet: a logger that waited for the reader would never finish.
  const bool finished = logged.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  std::thread reader;
  std::string out;
  reader = std::thread([&] { out = pipe.ReadToEnd(); });
  logged.wait();
  ASSERT_TRUE(finished) << "logging waited for the reader of its file descriptor";
  EXPECT_GT(sink->dropped(), 0u);
  sink->flush();
  const uint64_t dropped = sink->dropped();
  logger.reset();
  sink.reset();  // stops the writer
  close(pipe.write_fd);
  pipe.write_fd = -1;
  reader.join();

  // Every line whole and in order; the lines missing are exactly those the notices count.
  int next = 0;
  uint64_t reported = 0;
  int notices = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "info line ")) {
      int n = -1;
      ASSERT_TRUE(absl::SimpleAtoi(line.substr(0, line.find(' ')), &n)) << line;
      ASSERT_EQ(line.substr(line.find(' ') + 1), std::string(60, 'x'));
      ASSERT_GE(n, next) << "out of order";
      next = n + 1;
    } else {
      ASSERT_TRUE(absl::ConsumePrefix(&line, "warning logging: ")) << line;
      uint64_t count = 0;
      ASSERT_TRUE(absl::SimpleAtoi(line.substr(0, line.find(' ')), &count)) << line;
      EXPECT_THAT(std::string(line), HasSubstr("stderr was not read as fast"));
      reported += count;
      ++notices;
    }
  }
  EXPECT_GT(notices, 0);
  EXPECT_EQ(reported, dropped);
  const size_t written = std::count(out.begin(), out.end(), '\n') - notices;
  EXPECT_EQ(written + dropped, static_cast<size_t>(kLines));
}

TEST(NonBlockingSinkTest, ALineIsWrittenWithoutAFlush) {
  Pipe pipe;
  auto sink = std::make_shared<internal::NonBlockingSink>(pipe.write_fd, 64 << 10, false);
  auto logger = LoggerOver(sink);
  logger->warn("hello {}", 7);
  pollfd p{pipe.read_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 30000), 1) << "the writer did not write the line within 30 s";
  char buf[64] = {};
  ASSERT_GT(read(pipe.read_fd, buf, sizeof buf - 1), 0);
  EXPECT_EQ(std::string(buf), "warning hello 7\n");
}

TEST(NonBlockingSinkTest, ColorsOnlyTheLevelWhenAskedTo) {
  Pipe pipe;
  auto sink = std::make_shared<internal::NonBlockingSink>(pipe.write_fd, 64 << 10, true);
  auto logger = std::make_shared<spdlog::logger>("test", sink);
  logger->set_pattern("[%^%l%$] %v");
  logger->error("boom");
  logger->flush();
  logger.reset();
  sink.reset();
  close(pipe.write_fd);
  pipe.write_fd = -1;
  EXPECT_EQ(pipe.ReadToEnd(), "[\033[31m\033[1merror\033[m] boom\n");
}

TEST(LogFatalDeathTest, WritesTheMessageBeforeAborting) {
  EXPECT_DEATH(CONNEX_LOG_FATAL("the {} is gone", "disk"), "the disk is gone");
}

}  // namespace
}  // namespace connex
