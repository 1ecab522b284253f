// The spdlog logger behind connex/base/logging.h, for the few files that configure it (the
// level from a flag, flushing before an abort, the Python module) or log at a level chosen at
// run time. Everything else logs with the CONNEX_LOG_* macros and does not compile spdlog.
#ifndef CONNEX_BASE_LOGGING_SPDLOG_H_
#define CONNEX_BASE_LOGGING_SPDLOG_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "connex/base/logging.h"
#include "spdlog/spdlog.h"

namespace connex {

// The level named `text` (one of kLogLevelNames). InvalidArgument names the text and the accepted
// names: spdlog's own from_str maps an unknown name to `off`, which would silence every log.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view text);

// The process's logger; created on first use. An unknown CONNEX_LOG_LEVEL keeps `info` and says
// so once (binaries refuse it as a usage error before they log: connex/base/cli.h).
spdlog::logger& Log();

}  // namespace connex

#endif  // CONNEX_BASE_LOGGING_SPDLOG_H_
