// The access log: one line per answered request (id, status, tokens, latency), on the process's
// log (connex/base/logging.h) at info. With CONNEX_LOG_FORMAT=json every log line is a JSON object
// and an access line carries its fields as members of it; in text it is `access k=v ...`.
// Thread-safe.
#ifndef CONNEX_BASE_ACCESS_LOG_H_
#define CONNEX_BASE_ACCESS_LOG_H_

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace connex {

// One field of an access line: a string, or a number (written bare in JSON).
struct LogField {
  LogField(std::string_view key, std::string_view text) : key(key), value(text) {}
  LogField(std::string_view key, const char* text) : key(key), value(text) {}
  LogField(std::string_view key, int64_t number)
      : key(key), value(std::to_string(number)), number(true) {}
  LogField(std::string_view key, int number) : LogField(key, static_cast<int64_t>(number)) {}
  LogField(std::string_view key, double number);

  std::string_view key;  // [a-z_]+
  std::string value;
  bool number = false;
};

// Logs `fields` as one access line.
void LogAccess(std::span<const LogField> fields);
inline void LogAccess(std::initializer_list<LogField> fields) {
  LogAccess(std::span<const LogField>(fields.begin(), fields.size()));
}

// The line LogAccess writes for `fields` after the level and time: `access k=v ...` (a value
// with a space or quote in quotes) or, for JSON, the members `"k":v,...` (for tests).
std::string AccessLine(std::span<const LogField> fields, bool json);
inline std::string AccessLine(std::initializer_list<LogField> fields, bool json) {
  return AccessLine(std::span<const LogField>(fields.begin(), fields.size()), json);
}

}  // namespace connex

#endif  // CONNEX_BASE_ACCESS_LOG_H_
