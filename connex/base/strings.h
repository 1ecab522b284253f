// String helpers. Debian's abseil is built with its own absl::string_view (not an alias of
// std::string_view), so absl::StrCat and absl::SimpleAtoi do not accept std::string_view. The
// project uses std::string_view in its APIs and these helpers to bridge. Thread-safe (stateless).
#ifndef CONNEX_BASE_STRINGS_H_
#define CONNEX_BASE_STRINGS_H_

#include <iterator>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "fmt/format.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(s.data(), s.size()), ctx);
  }
};

namespace connex {

// Concatenates anything fmt can format ("{}"), std::string_view and absl::string_view included.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (fmt::format_to(std::back_inserter(out), "{}", args), ...);
  return out;
}

inline absl::string_view AsAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
inline std::string_view AsStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace connex

#endif  // CONNEX_BASE_STRINGS_H_
