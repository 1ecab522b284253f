// Logging: one logger for the process, written to stderr, level from CONNEX_LOG_LEVEL (trace,
// debug, info, warn, error, off; default info) or a binary's --log-level; text or, with
// CONNEX_LOG_FORMAT=json, a JSON object a line. Thread-safe.
//
// CONNEX_LOG_INFO("fmt {}", args...) formats with {fmt} only when the level is on. This header
// carries {fmt} alone; the logger behind it is spdlog, whose header only the few files that
// configure it include (logging_spdlog.h).
#ifndef CONNEX_BASE_LOGGING_H_
#define CONNEX_BASE_LOGGING_H_

#include <cstdint>
#include <string_view>

#include "fmt/format.h"

namespace connex {

// The accepted level names, as shown in messages and --help.
inline constexpr std::string_view kLogLevelNames = "trace, debug, info, warn, error, off";

// In spdlog's order (logging_spdlog.h converts).
enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kCritical, kOff };

namespace internal {
// Whether a line at `level` is written now.
bool LogEnabled(LogLevel level);
// Writes one line at `level`.
void LogLine(LogLevel level, std::string_view message);
// Writes `message` at the critical level, waits until the log is written out, and aborts.
[[noreturn]] void LogFatal(std::string_view message);
}  // namespace internal

// Lines the process's log dropped because stderr was not read as fast as it logged (logging
// never waits for the reader; each loss is also reported by a warning line in the log).
uint64_t LogLinesDropped();

}  // namespace connex

#define CONNEX_LOG_AT_(level, ...)                                    \
  do {                                                                \
    if (::connex::internal::LogEnabled(level)) {                      \
      ::connex::internal::LogLine(level, ::fmt::format(__VA_ARGS__)); \
    }                                                                 \
  } while (false)
#define CONNEX_LOG_TRACE(...) CONNEX_LOG_AT_(::connex::LogLevel::kTrace, __VA_ARGS__)
#define CONNEX_LOG_DEBUG(...) CONNEX_LOG_AT_(::connex::LogLevel::kDebug, __VA_ARGS__)
#define CONNEX_LOG_INFO(...) CONNEX_LOG_AT_(::connex::LogLevel::kInfo, __VA_ARGS__)
#define CONNEX_LOG_WARN(...) CONNEX_LOG_AT_(::connex::LogLevel::kWarn, __VA_ARGS__)
#define CONNEX_LOG_ERROR(...) CONNEX_LOG_AT_(::connex::LogLevel::kError, __VA_ARGS__)
// For a state the process cannot go on from (not for bad input): logs at the critical level,
// waits until the log is written out, and aborts.
#define CONNEX_LOG_FATAL(...) ::connex::internal::LogFatal(::fmt::format(__VA_ARGS__))

#endif  // CONNEX_BASE_LOGGING_H_
