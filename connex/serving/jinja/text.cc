#include "connex/serving/jinja/text.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace connex::serving::jinja {

size_t Utf16Length(std::string_view text) {
  size_t units = 0;
  for (size_t pos = 0; pos < text.size();) units += NextCodePoint(text, &pos) >= 0x10000 ? 2 : 1;
  return units;
}

std::string_view TrimJs(std::string_view text) { return TrimJsEnd(TrimJsStart(text)); }

std::vector<std::string_view> SplitCodePoints(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    NextCodePoint(text, &pos);
    out.push_back(text.substr(start, pos - start));
  }
  return out;
}

std::string AsciiUpper(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

namespace {

void AppendUnit(char32_t unit, std::string* out) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(unit & 0xFFFF));
  out->append(buf);
}

}  // namespace

std::string JsonQuote(std::string_view text, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const char32_t cp = NextCodePoint(text, &pos);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      AppendUnit(cp, &out);
    } else if (ensure_ascii && cp >= 0x7f) {
      if (cp >= 0x10000) {
        AppendUnit(0xD800 + ((cp - 0x10000) >> 10), &out);
        AppendUnit(0xDC00 + ((cp - 0x10000) & 0x3FF), &out);
      } else {
        AppendUnit(cp, &out);
      }
    } else {
      out.append(text.substr(start, pos - start));
    }
  }
  out += "\"";
  return out;
}

std::string JsNumberToString(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return "0";
  char buf[64];
  const double magnitude = std::fabs(value);
  if (magnitude >= 1e-6 && magnitude < 1e21) {
    auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::fixed);
    return std::string(buf, result.ptr);
  }
  // Scientific, in JavaScript's spelling: "1e+21", "1.5e-7".
  auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string text(buf, result.ptr);
  const size_t e = text.find('e');
  std::string mantissa = text.substr(0, e);
  std::string exponent = text.substr(e + 1);
  const char sign = exponent[0];
  exponent = exponent.substr(1);
  while (exponent.size() > 1 && exponent[0] == '0') exponent.erase(0, 1);
  return mantissa + "e" + sign + exponent;
}

}  // namespace connex::serving::jinja
