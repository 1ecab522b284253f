#include "connex/base/logging.h"

#include <unistd.h>

#include <cmath>
#include <ctime>
#include <memory>
#include <string>

#include "connex/base/access_log.h"
#include "connex/base/config.h"
#include "connex/base/log_sink.h"
#include "connex/base/logging_spdlog.h"
#include "connex/base/strings.h"
#include "spdlog/details/os.h"
#include "spdlog/pattern_formatter.h"

namespace connex {
namespace {

constexpr std::string_view kAccessLogger = "access";

// Bytes of log lines queued for stderr at most (connex/base/log_sink.h): about 7,000 lines.
constexpr size_t kLogQueueBytes = size_t{1} << 20;

internal::NonBlockingSink* process_sink = nullptr;

void AppendJsonString(std::string* out, std::string_view text) {
  *out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          *out += escaped;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

// CONNEX_LOG_FORMAT=json: one object a line, {"time","level","pid","msg"} or, for an access
// line, its fields in place of "msg". The time is ISO 8601 with the UTC offset.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string line = "{\"time\":\"";
    const auto since_epoch = msg.time.time_since_epoch();
    const std::time_t seconds =
        std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
    const int64_t millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
    std::tm local{};
    localtime_r(&seconds, &local);
    char stamp[64];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &local);
    char zone[16];
    std::strftime(zone, sizeof zone, "%z", &local);  // +hhmm
    std::string_view z(zone);
    line += StrCat(stamp, ".", fmt::format("{:03}", millis), z.substr(0, 3), ":", z.substr(3),
                   "\",\"level\":\"");
    const auto level = spdlog::level::to_string_view(msg.level);
    line += std::string_view(level.data(), level.size());
    line += StrCat("\",\"pid\":", getpid(), ",");
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    if (std::string_view(msg.logger_name.data(), msg.logger_name.size()) == kAccessLogger) {
      line += "\"event\":\"access\",";
      line += payload;  // members already (AccessLine)
    } else {
      line += "\"msg\":";
      AppendJsonString(&line, payload);
    }
    line += "}\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

bool JsonLogs() {
  static const bool json = EnvString("CONNEX_LOG_FORMAT", "text") == "json";
  return json;
}

void Configure(spdlog::logger& l) {
  if (JsonLogs()) {
    l.set_formatter(std::make_unique<JsonFormatter>());
  } else {
    l.set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%L%$ [%P] %v");
  }
}

}  // namespace

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
    // Never blocks the thread that logs (a slow reader of stderr would stall it); written out
    // at exit, and before an abort (flush_on critical: CONNEX_CHECK, CONNEX_LOG_FATAL).
    const bool color =
        spdlog::details::os::in_terminal(stderr) && spdlog::details::os::is_color_terminal();
    auto sink = std::make_shared<internal::NonBlockingSink>(STDERR_FILENO, kLogQueueBytes, color);
    sink->HandleForks();
    process_sink = sink.get();
    auto* l = new spdlog::logger("connex", std::move(sink));
    Configure(*l);
    l->flush_on(spdlog::level::critical);
    std::atexit([] { process_sink->flush(); });
    const std::string format = EnvString("CONNEX_LOG_FORMAT", "text");
    absl::StatusOr<spdlog::level::level_enum> level =
        ParseLogLevel(EnvString("CONNEX_LOG_LEVEL", "info"));
    l->set_level(level.ok() ? *level : spdlog::level::info);
    if (!level.ok()) l->warn("CONNEX_LOG_LEVEL: {}; logging at info", level.status().message());
    if (format != "text" && format != "json") {
      l->warn("CONNEX_LOG_FORMAT: '{}' is not a log format (text or json); logging as text",
              format);
    }
    return l;
  }();
  return *logger;
}

static_assert(static_cast<int>(LogLevel::kTrace) == spdlog::level::trace &&
              static_cast<int>(LogLevel::kInfo) == spdlog::level::info &&
              static_cast<int>(LogLevel::kError) == spdlog::level::err &&
              static_cast<int>(LogLevel::kOff) == spdlog::level::off);

namespace internal {

bool LogEnabled(LogLevel level) {
  return Log().should_log(static_cast<spdlog::level::level_enum>(level));
}

void LogLine(LogLevel level, std::string_view message) {
  Log().log(static_cast<spdlog::level::level_enum>(level), "{}", message);
}

void LogFatal(std::string_view message) {
  Log().critical("{}", message);
  Log().flush();
  std::abort();
}

}  // namespace internal

uint64_t LogLinesDropped() {
  Log();
  return process_sink->dropped();
}

LogField::LogField(std::string_view key, double number) : key(key), number(true) {
  value = std::isfinite(number) ? fmt::format("{:.6g}", number) : "null";
}

std::string AccessLine(std::span<const LogField> fields, bool json) {
  std::string out = json ? "" : "access";
  bool first = true;
  for (const LogField& f : fields) {
    if (json) {
      if (!first) out += ',';
      AppendJsonString(&out, f.key);
      out += ':';
      if (f.number) {
        out += f.value;
      } else {
        AppendJsonString(&out, f.value);
      }
    } else {
      out += StrCat(" ", f.key, "=");
      const bool quote = f.value.empty() || f.value.find_first_of(" \"=") != std::string::npos;
      if (quote) {
        AppendJsonString(&out, f.value);
      } else {
        out += f.value;
      }
    }
    first = false;
  }
  return out;
}

void LogAccess(std::span<const LogField> fields) {
  // The access lines share the process log's sink and level; only the JSON formatter tells them
  // apart (by the logger's name).
  static spdlog::logger* access = [] {
    auto* l =
        new spdlog::logger(std::string(kAccessLogger), Log().sinks().begin(), Log().sinks().end());
    Configure(*l);
    return l;
  }();
  access->set_level(Log().level());
  if (!access->should_log(spdlog::level::info)) return;
  access->info("{}", AccessLine(fields, JsonLogs()));
}

}  // namespace connex
