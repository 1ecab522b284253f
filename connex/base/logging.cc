#include "connex/base/logging.h"

#include <memory>

#include "connex/base/config.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace connex {

spdlog::logger& Log() {
  static spdlog::logger* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* l = new spdlog::logger("connex", std::move(sink));
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%P] %v");
    std::string level = EnvString("CONNEX_LOG_LEVEL", "info");
    spdlog::level::level_enum parsed = spdlog::level::from_str(level);
    // from_str maps unknown names to off; only accept "off" when it was asked for.
    if (parsed == spdlog::level::off && level != "off") parsed = spdlog::level::info;
    l->set_level(parsed);
    l->flush_on(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

}  // namespace connex
