// What systemd would run for a unit of deploy/systemd: its ExecStart's words and its environment
// (Environment= and EnvironmentFile= in order, later assignments winning), parsed as systemd
// parses them for the syntax those files use — continuation lines, "-" before an optional
// EnvironmentFile, %i / %% specifiers, quotes and # / ; comments in environment files. What the
// parser does not implement ($VAR expansion in ExecStart, prefixes like "@" or "!" on ExecStart,
// several ExecStart lines) is refused by name, so a unit that uses it fails the test instead of
// being run differently from systemd. Thread-compatible.
#ifndef CONNEX_TESTS_SYSTEMD_UNIT_H_
#define CONNEX_TESTS_SYSTEMD_UNIT_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::testing {

struct SystemdService {
  std::vector<std::string> exec_start;   // argv
  std::vector<std::string> environment;  // NAME=VALUE, in the order systemd applies them
};

// Parses an environment file's text (systemd.exec(5), EnvironmentFile=): NAME=VALUE lines, blank
// lines and lines starting with # or ; ignored, a value in "..." or '...' unquoted, a trailing
// backslash joining the next line. InvalidArgument naming `what` and the line otherwise.
absl::StatusOr<std::vector<std::string>> ParseEnvironmentFile(const std::string& what,
                                                              const std::string& text);

// Parses the unit file at `path` for instance `instance` (empty: not a template). `map_path`
// rewrites every absolute path of the unit (ExecStart's words, EnvironmentFile's paths, the
// values of the environment) — where the test installs what the unit names under /etc, /opt, ...
absl::StatusOr<SystemdService> ParseServiceUnit(
    const std::string& path, const std::string& instance,
    const std::function<std::string(const std::string&)>& map_path);

}  // namespace connex::testing

#endif  // CONNEX_TESTS_SYSTEMD_UNIT_H_
