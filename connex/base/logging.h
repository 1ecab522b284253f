// Logging: one spdlog logger for the process, written to stderr, level from CONNEX_LOG_LEVEL
// (trace, debug, info, warn, error, off; default info) or a binary's --log-level. Thread-safe.
#ifndef CONNEX_BASE_LOGGING_H_
#define CONNEX_BASE_LOGGING_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "spdlog/spdlog.h"

namespace connex {

// The accepted level names, as shown in messages and --help.
inline constexpr std::string_view kLogLevelNames = "trace, debug, info, warn, error, off";

// The level named `text` (one of kLogLevelNames). InvalidArgument names the text and the accepted
// names: spdlog's own from_str maps an unknown name to `off`, which would silence every log.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view text);

// The process's logger; created on first use. An unknown CONNEX_LOG_LEVEL keeps `info` and says
// so once (binaries refuse it as a usage error before they log: connex/base/cli.h).
spdlog::logger& Log();

}  // namespace connex

#define CONNEX_LOG_TRACE(...) ::connex::Log().trace(__VA_ARGS__)
#define CONNEX_LOG_DEBUG(...) ::connex::Log().debug(__VA_ARGS__)
#define CONNEX_LOG_INFO(...) ::connex::Log().info(__VA_ARGS__)
#define CONNEX_LOG_WARN(...) ::connex::Log().warn(__VA_ARGS__)
#define CONNEX_LOG_ERROR(...) ::connex::Log().error(__VA_ARGS__)

#endif  // CONNEX_BASE_LOGGING_H_
