#include "connex/base/config.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "connex/base/strings.h"

namespace connex {

std::optional<std::string> GetEnv(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

absl::StatusOr<int64_t> EnvInt(std::string_view name, int64_t default_value, int64_t min,
                               int64_t max) {
  std::optional<std::string> text = GetEnv(name);
  if (!text) return default_value;
  int64_t value = 0;
  if (!absl::SimpleAtoi(*text, &value)) {
    return absl::InvalidArgumentError(StrCat(name, "='", *text, "' is not an integer"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        StrCat(name, "=", value, " is out of range [", min, ", ", max, "]"));
  }
  return value;
}

std::string EnvString(std::string_view name, std::string_view default_value) {
  std::optional<std::string> text = GetEnv(name);
  return text ? *text : std::string(default_value);
}

std::optional<bool> ParseBool(std::string_view text) {
  std::string lower = absl::AsciiStrToLower(AsAbsl(text));
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

absl::StatusOr<bool> EnvBool(std::string_view name, bool default_value) {
  std::optional<std::string> text = GetEnv(name);
  if (!text) return default_value;
  if (std::optional<bool> value = ParseBool(*text)) return *value;
  return absl::InvalidArgumentError(
      StrCat(name, "='", *text, "' is not a boolean (use 1/0, true/false, yes/no, on/off)"));
}

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  std::string_view digits = text;
  size_t i = 0;
  while (i < digits.size() && digits[i] >= '0' && digits[i] <= '9') ++i;
  std::string_view number = digits.substr(0, i);
  std::string suffix = absl::AsciiStrToUpper(AsAbsl(digits.substr(i)));
  uint64_t value = 0;
  if (number.empty() || !absl::SimpleAtoi(AsAbsl(number), &value)) {
    return absl::InvalidArgumentError(StrCat("size '", text, "' does not start with a number"));
  }
  uint64_t multiplier = 1;
  if (suffix.empty() || suffix == "B") {
    multiplier = 1;
  } else if (suffix == "K" || suffix == "KB" || suffix == "KIB") {
    multiplier = 1ull << 10;
  } else if (suffix == "M" || suffix == "MB" || suffix == "MIB") {
    multiplier = 1ull << 20;
  } else if (suffix == "G" || suffix == "GB" || suffix == "GIB") {
    multiplier = 1ull << 30;
  } else {
    return absl::InvalidArgumentError(
        StrCat("size '", text, "' has unknown suffix '", digits.substr(i), "' (use K, M or G)"));
  }
  if (value > (~0ull) / multiplier) {
    return absl::InvalidArgumentError(StrCat("size '", text, "' is too large"));
  }
  return value * multiplier;
}

}  // namespace connex
