#include "connex/base/cli.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_split.h"
#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/logging_spdlog.h"
#include "connex/base/strings.h"

namespace connex {

CLI::Option* AddLogLevelFlag(CLI::App& app, std::string_view default_level) {
  CLI::Validator names(
      [](std::string& text) -> std::string {
        absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel(text);
        return level.ok() ? std::string() : std::string(level.status().message());
      },
      "LEVEL");
  return app
      .add_option_function<std::string>(
          "--log-level",
          [](const std::string& text) {
            absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel(text);
            if (level.ok()) Log().set_level(*level);
          },
          StrCat("log level: ", kLogLevelNames))
      ->envname("CONNEX_LOG_LEVEL")
      ->check(names)
      ->default_str(std::string(default_level))
      ->force_callback();
}

CLI::Option* AddInsecureFlag(CLI::App& app) {
  return app.add_flag_callback(
      "--insecure", [] { setenv("CONNEX_INSECURE", "1", 1); },
      "listen beyond loopback without authentication (CONNEX_INSECURE=1): the data plane and "
      "HTTP always, ZeroMQ sockets without a CURVE key pair");
}

CLI::Option* AddRefusedSecretFlag(CLI::App& app, const std::string& name,
                                  const std::string& use_instead) {
  return app
      .add_option(name, "")
      // Validators run on every value given, so this one refuses each of them.
      ->check(CLI::Validator(
          [use_instead](std::string&) -> std::string {
            return "a secret is never taken from the command line (ps shows it to every user); "
                   "use " +
                   use_instead;
          },
          ""))
      ->group("");  // hidden from --help
}

CLI::Validator SizeRange(uint64_t min, uint64_t max, bool list) {
  return CLI::Validator(
      [min, max, list](std::string& text) -> std::string {
        std::vector<std::string> items;
        if (list) {
          items = absl::StrSplit(text, ',');
        } else {
          items = {text};
        }
        for (const std::string& item : items) {
          absl::StatusOr<uint64_t> size = ParseSize(item);
          if (!size.ok()) return std::string(size.status().message());
          if (*size < min || *size > max) {
            return StrCat(item, " (", *size, " bytes) is outside the limits [", min, ", ", max,
                          "] bytes");
          }
        }
        return std::string();
      },
      list ? "SIZE,..." : "SIZE");
}

std::string VersionText(std::string_view program) {
  const size_t slash = program.rfind('/');
  if (slash != std::string_view::npos) program.remove_prefix(slash + 1);
  return StrCat(program.empty() ? "connex" : program, " ", CONNEX_VERSION);
}

std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv,
                              const std::function<void()>& also) {
  if (app.get_version_ptr() == nullptr) {
    app.set_version_flag("--version", VersionText(argc > 0 ? argv[0] : ""),
                         "print the program's name and Connex version, then exit");
  }
  try {
    app.parse(argc, argv);
    if (also) also();
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageExitCode;
  }
  return std::nullopt;
}

}  // namespace connex
