// Configuration from the environment. Every setting of Connex is an environment variable
// CONNEX_* and a flag of the binary that uses it (docs/configuration.md lists them all); binaries
// bind flags with CLI11 (`->envname(...)`), and library code reads the same variables through
// these helpers when a caller did not set an option explicitly. Thread-safe (reads only).
#ifndef CONNEX_BASE_CONFIG_H_
#define CONNEX_BASE_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace connex {

// The value of environment variable `name`, or nullopt when unset or empty.
std::optional<std::string> GetEnv(std::string_view name);

// Integer variable `name` in [min, max], or `default_value` when unset. InvalidArgument names the
// variable and the bad value.
absl::StatusOr<int64_t> EnvInt(std::string_view name, int64_t default_value, int64_t min,
                               int64_t max);

// String variable `name`, or `default_value` when unset.
std::string EnvString(std::string_view name, std::string_view default_value);

// Boolean variable: 1/true/yes/on or 0/false/no/off (any case).
absl::StatusOr<bool> EnvBool(std::string_view name, bool default_value);
// 1/0, true/false, yes/no, on/off (any case); nullopt for anything else.
std::optional<bool> ParseBool(std::string_view text);

// Parses a size such as `4096`, `4K`, `64KiB`, `1M`, `16MB`, `1G` (binary multiples).
absl::StatusOr<uint64_t> ParseSize(std::string_view text);

}  // namespace connex

#endif  // CONNEX_BASE_CONFIG_H_
