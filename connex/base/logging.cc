#include "connex/base/logging.h"

#include <memory>
#include <string>

#include "connex/base/config.h"
#include "connex/base/strings.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace connex {

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view text) {
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [name, level] : kLevels) {
    if (text == name) return level;
  }
  return absl::InvalidArgumentError(
      StrCat("'", text, "' is not a log level (one of ", kLogLevelNames, ")"));
}

spdlog::logger& Log() {
  static spdlog::logger* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* l = new spdlog::logger("connex", std::move(sink));
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%P] %v");
    l->flush_on(spdlog::level::warn);
    absl::StatusOr<spdlog::level::level_enum> level =
        ParseLogLevel(EnvString("CONNEX_LOG_LEVEL", "info"));
    l->set_level(level.ok() ? *level : spdlog::level::info);
    if (!level.ok()) l->warn("CONNEX_LOG_LEVEL: {}; logging at info", level.status().message());
    return l;
  }();
  return *logger;
}

}  // namespace connex
