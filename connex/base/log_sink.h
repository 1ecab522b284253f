// The process logger's sink: lines go to a file descriptor (stderr) without ever blocking the
// thread that logs. A synchronous stderr sink stalls every logging thread — a directory's loop,
// a stage's step loop — for as long as whoever reads the process's stderr is slow; a reader of
// 3,000 bytes every half second made a third of the pp campaign's seeds miss their deadlines.
//
// A line is formatted in the caller's thread (its time is when it was logged) and appended to a
// bounded queue; a writer thread of the sink writes the queue out. When the queue is full the
// line is dropped and counted, and the next line that fits is preceded by a warning saying how
// many were lost. flush() writes everything queued from the calling thread and blocks until it
// is written: for the last words before an abort (CONNEX_CHECK, CONNEX_LOG_FATAL) and at exit.
//
// Only spdlog's configuration files include this header (logging_spdlog.h). Thread-safe.
#ifndef CONNEX_BASE_LOG_SINK_H_
#define CONNEX_BASE_LOG_SINK_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "spdlog/sinks/sink.h"

namespace connex::internal {

class NonBlockingSink final : public spdlog::sinks::sink {
 public:
  // Writes to `fd` (not owned), keeping at most `capacity` bytes queued. `color`: the level in
  // ANSI colours, as spdlog's colour sinks do on a terminal.
  NonBlockingSink(int fd, size_t capacity, bool color);
  ~NonBlockingSink() override;

  void log(const spdlog::details::log_msg& msg) override;
  void flush() override;
  void set_pattern(const std::string& pattern) override;
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override;

  // Lines dropped since the sink was made because the queue was full.
  uint64_t dropped() const;

  // Makes this sink usable in a child forked while other threads logged: the child starts with
  // an empty queue and no writer thread (one is started when it next logs). Used for the
  // process logger's sink (pthread_atfork); at most one sink is registered.
  void HandleForks();

 private:
  void AppendLocked(const spdlog::details::log_msg& msg);
  void AppendDropNoticeLocked();
  void StartWriterLocked();
  void WriterLoop();
  // Takes the queue and writes it; the caller holds write_mu_.
  void WriteQueued();
  void WriteAll(const std::string& bytes);

  static void PrepareFork();
  static void AfterForkInParent();
  static void AfterForkInChild();

  const int fd_;
  const size_t capacity_;
  const bool color_;

  // Plain std types rather than connex::Mutex: the child of a fork re-creates them in place.
  mutable std::mutex mu_;  // guards everything below it but out_
  std::condition_variable wake_;
  std::unique_ptr<spdlog::formatter> formatter_;
  spdlog::memory_buf_t line_;
  std::string queue_;
  uint64_t dropped_pending_ = 0;  // not yet reported in a notice
  uint64_t dropped_total_ = 0;
  bool writer_started_ = false;
  bool stopping_ = false;
  std::thread writer_;

  std::mutex write_mu_;  // held while writing to fd_; guards out_
  std::string out_;
};

}  // namespace connex::internal

#endif  // CONNEX_BASE_LOG_SINK_H_
