// Logging: one spdlog logger for the process, written to stderr, level from CONNEX_LOG_LEVEL
// (trace, debug, info, warn, error, off; default info). Thread-safe.
#ifndef CONNEX_BASE_LOGGING_H_
#define CONNEX_BASE_LOGGING_H_

#include "spdlog/spdlog.h"

namespace connex {

// The process's logger; created on first use.
spdlog::logger& Log();

}  // namespace connex

#define CONNEX_LOG_TRACE(...) ::connex::Log().trace(__VA_ARGS__)
#define CONNEX_LOG_DEBUG(...) ::connex::Log().debug(__VA_ARGS__)
#define CONNEX_LOG_INFO(...) ::connex::Log().info(__VA_ARGS__)
#define CONNEX_LOG_WARN(...) ::connex::Log().warn(__VA_ARGS__)
#define CONNEX_LOG_ERROR(...) ::connex::Log().error(__VA_ARGS__)

#endif  // CONNEX_BASE_LOGGING_H_
