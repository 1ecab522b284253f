// Flag parsing shared by every binary (CLI11): the --log-level flag, size flags with limits, and
// the exit codes of a parse (0 after --help, 2 for a usage error, in every binary alike).
// Thread-compatible: binaries call these from main before starting threads.
#ifndef CONNEX_BASE_CLI_H_
#define CONNEX_BASE_CLI_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "CLI/CLI.hpp"

namespace connex {

// The exit code of a usage error (a bad flag or value) in every binary.
inline constexpr int kUsageExitCode = 2;

// Adds --log-level (variable CONNEX_LOG_LEVEL) to `app`: one of kLogLevelNames, anything else is
// a usage error naming the accepted names. The level applies while `app` is parsed;
// `default_level` when neither the flag nor the variable is given.
CLI::Option* AddLogLevelFlag(CLI::App& app, std::string_view default_level = "info");

// Adds --insecure (variable CONNEX_INSECURE): lets the listeners of this process use a
// non-loopback address without authentication (connex/base/curve.h, CheckListenExposure). The flag
// sets CONNEX_INSECURE=1 for the process.
CLI::Option* AddInsecureFlag(CLI::App& app);

// Adds a hidden flag `name` that is always a usage error: a secret is never taken from argv
// (`ps` shows every process's argv to every user). The message names `use_instead`, e.g.
// "--token-file FILE or CONNEX_DIRECTORY_TOKEN".
CLI::Option* AddRefusedSecretFlag(CLI::App& app, const std::string& name,
                                  const std::string& use_instead);

// A validator for a size flag (`4096`, `4K`, `64KiB`, `1M`, `1G`: ParseSize) that must lie in
// [min, max] bytes; with `list`, every item of a comma-separated list must. The message names the
// value and the limit (CLI11 prefixes the flag).
CLI::Validator SizeRange(uint64_t min, uint64_t max, bool list = false);

// "PROGRAM VERSION": the basename of `program` (argv[0]) and the project's version (CMake's
// PROJECT_VERSION), as every binary's --version prints it.
std::string VersionText(std::string_view program);

// Parses `argv` into `app` (adding --version unless `app` has a version flag already); `also`
// (optional) runs right after, for checks across flags that throw a CLI::ParseError. Returns
// nullopt to go on, otherwise the exit code with CLI11's message printed: 0 after --help,
// kUsageExitCode for any parse or validation error. (CLI11's own `app.exit(e)` returns 105..114 for
// errors, which scripts cannot tell from a crash.)
std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv,
                              const std::function<void()>& also = {});

}  // namespace connex

#endif  // CONNEX_BASE_CLI_H_
