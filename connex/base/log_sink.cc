#include "connex/base/log_sink.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <string_view>

#include "connex/base/check.h"
#include "fmt/format.h"
#include "spdlog/details/log_msg.h"
#include "spdlog/pattern_formatter.h"

namespace connex::internal {
namespace {

// The sink whose state a fork's child resets (HandleForks); at most one.
std::atomic<NonBlockingSink*> fork_sink{nullptr};

// As spdlog's ANSI colour sinks colour each level.
std::string_view LevelColor(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "\033[37m";
    case spdlog::level::debug:
      return "\033[36m";
    case spdlog::level::info:
      return "\033[32m";
    case spdlog::level::warn:
      return "\033[33m\033[1m";
    case spdlog::level::err:
      return "\033[31m\033[1m";
    case spdlog::level::critical:
      return "\033[1m\033[41m";
    default:
      return "";
  }
}
constexpr std::string_view kColorReset = "\033[m";

// A buffer larger than this is given back once written.
constexpr size_t kKeptBufferBytes = 64 << 10;

}  // namespace

NonBlockingSink::NonBlockingSink(int fd, size_t capacity, bool color)
    : fd_(fd),
      capacity_(capacity),
      color_(color),
      formatter_(std::make_unique<spdlog::pattern_formatter>()) {}

NonBlockingSink::~NonBlockingSink() {
  NonBlockingSink* self = this;
  fork_sink.compare_exchange_strong(self, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
  flush();
}

void NonBlockingSink::log(const spdlog::details::log_msg& msg) {
  std::lock_guard<std::mutex> lock(mu_);
  AppendLocked(msg);
}

void NonBlockingSink::AppendLocked(const spdlog::details::log_msg& msg) {
  line_.clear();
  formatter_->format(msg, line_);
  const std::string_view line(line_.data(), line_.size());
  const bool colored =
      color_ && msg.color_range_end > msg.color_range_start && msg.color_range_end <= line.size();
  const std::string_view color = colored ? LevelColor(msg.level) : "";
  const size_t bytes = line.size() + (colored ? color.size() + kColorReset.size() : 0);
  if (queue_.size() + bytes > capacity_) {
    // Full: whoever reads our stderr is slower than we log. Never wait for them.
    ++dropped_pending_;
    ++dropped_total_;
    return;
  }
  if (colored) {
    queue_ += line.substr(0, msg.color_range_start);
    queue_ += color;
    queue_ += line.substr(msg.color_range_start, msg.color_range_end - msg.color_range_start);
    queue_ += kColorReset;
    queue_ += line.substr(msg.color_range_end);
  } else {
    queue_ += line;
  }
  if (!writer_started_) StartWriterLocked();
  wake_.notify_one();
}

void NonBlockingSink::AppendDropNoticeLocked() {
  const std::string text = fmt::format(
      "logging: {} line(s) dropped: stderr was not read as fast as the process "
      "logged ({} dropped since start)",
      dropped_pending_, dropped_total_);
  const spdlog::details::log_msg notice(spdlog::source_loc{}, "connex", spdlog::level::warn, text);
  line_.clear();
  formatter_->format(notice, line_);
  queue_.append(line_.data(), line_.size());  // beyond the capacity: it is one line
  dropped_pending_ = 0;
}

void NonBlockingSink::StartWriterLocked() {
  // The writer takes no signal: a process-directed SIGTERM must reach the thread that waits for
  // it (connex/base/signals.h blocks it in the threads it starts), not end the process here.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  writer_ = std::thread([this] { WriterLoop(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  writer_started_ = true;
}

void NonBlockingSink::WriterLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
    }
    std::lock_guard<std::mutex> write_lock(write_mu_);
    WriteQueued();
  }
}

void NonBlockingSink::flush() {
  std::lock_guard<std::mutex> write_lock(write_mu_);
  WriteQueued();
}

void NonBlockingSink::WriteQueued() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The dropped lines came after what is queued and before anything logged from now on.
    if (dropped_pending_ > 0) AppendDropNoticeLocked();
    out_.swap(queue_);
  }
  WriteAll(out_);
  // A burst's buffer is not kept: the two buffers trade places, so both would stay at the size
  // of the largest burst (up to the capacity) for the process's life.
  if (out_.capacity() > kKeptBufferBytes) {
    std::string().swap(out_);
  } else {
    out_.clear();
  }
}

void NonBlockingSink::WriteAll(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // A non-blocking descriptor (its flags are shared with whoever else holds it).
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else {
      return;  // closed or broken: nothing can be written, and logging must not fail the caller
    }
  }
}

void NonBlockingSink::set_pattern(const std::string& pattern) {
  std::lock_guard<std::mutex> lock(mu_);
  formatter_ = std::make_unique<spdlog::pattern_formatter>(pattern);
}

void NonBlockingSink::set_formatter(std::unique_ptr<spdlog::formatter> formatter) {
  std::lock_guard<std::mutex> lock(mu_);
  formatter_ = std::move(formatter);
}

uint64_t NonBlockingSink::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_total_;
}

void NonBlockingSink::HandleForks() {
  NonBlockingSink* none = nullptr;
  CONNEX_CHECK(fork_sink.compare_exchange_strong(none, this));
  static const int registered = pthread_atfork(&PrepareFork, &AfterForkInParent, &AfterForkInChild);
  (void)registered;
}

// The queue is consistent across a fork: the forking thread holds mu_ while it forks (mu_ is
// never held while writing). write_mu_ may be held by the writer, blocked on a slow reader, so a
// fork does not wait for it; the child, where the writer does not exist, re-creates it.
void NonBlockingSink::PrepareFork() {
  if (NonBlockingSink* s = fork_sink.load()) s->mu_.lock();
}

void NonBlockingSink::AfterForkInParent() {
  if (NonBlockingSink* s = fork_sink.load()) s->mu_.unlock();
}

void NonBlockingSink::AfterForkInChild() {
  NonBlockingSink* s = fork_sink.load();
  if (s == nullptr) return;
  // Only the forking thread exists here: the locks, the condition and the writer's handle are
  // made anew (the parent's writer is not this process's to join), and what the parent queued
  // is the parent's to write.
  new (&s->mu_) std::mutex;
  new (&s->wake_) std::condition_variable;
  new (&s->write_mu_) std::mutex;
  new (&s->writer_) std::thread;
  s->queue_.clear();
  s->out_.clear();
  s->dropped_pending_ = 0;
  s->writer_started_ = false;
}

}  // namespace connex::internal
