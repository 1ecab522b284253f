// String helpers. Debian's abseil is built with its own absl::string_view (not an alias of
// std::string_view), so absl::StrCat and absl::SimpleAtoi do not accept std::string_view. The
// project uses std::string_view in its APIs and these helpers to bridge. Thread-safe (stateless).
#ifndef CONNEX_BASE_STRINGS_H_
#define CONNEX_BASE_STRINGS_H_

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

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

namespace internal {

// One argument of StrCat as text, as {fmt} writes it with "{}": text is viewed, not copied;
// numbers, bool and char are formatted by functions compiled once (strings.cc); anything else
// (a type with a fmt::formatter) by {fmt} itself. StrCat's 1,000-odd call sites used to
// instantiate {fmt}'s checked format_to for every combination of argument types, string
// literals of each length included (the demo's compiles: 424 CPU s with it, 324 without).
class StrCatPiece {
 public:
  StrCatPiece(std::string_view s) : view_(s) {}
  StrCatPiece(const std::string& s) : view_(s) {}
  StrCatPiece(const char* s) : view_(s) {}
  // A null pointer is no text: StrCat(nullptr) would read address 0 through the const char* above.
  StrCatPiece(std::nullptr_t) = delete;
  StrCatPiece(absl::string_view s) : view_(s.data(), s.size()) {}
  StrCatPiece(char c) : view_(buffer_, 1) { buffer_[0] = c; }
  StrCatPiece(bool b) : view_(b ? "true" : "false") {}
  StrCatPiece(double v);
  StrCatPiece(float v);
  StrCatPiece(long double v);
  template <std::integral T>
  StrCatPiece(T v) {
    if constexpr (std::is_signed_v<T>) {
      view_ = FormatSigned(static_cast<int64_t>(v));
    } else {
      view_ = FormatUnsigned(static_cast<uint64_t>(v));
    }
  }
  // Everything else {fmt} formats (enums and classes with a fmt::formatter, pointers, ...).
  template <typename T>
  requires(!std::is_arithmetic_v<T> && !std::is_convertible_v<const T&, std::string_view> &&
           !std::is_convertible_v<const T&, absl::string_view>) StrCatPiece(const T& v)
      : owned_(fmt::format("{}", v)), view_(owned_) {}

  StrCatPiece(const StrCatPiece&) = delete;
  StrCatPiece& operator=(const StrCatPiece&) = delete;

  std::string_view view() const { return view_; }

 private:
  std::string_view FormatSigned(int64_t v);
  std::string_view FormatUnsigned(uint64_t v);

  std::string owned_;
  std::string_view view_;
  char buffer_[32];  // a number's digits: "{}" of a long double is at most 29 characters
};

// The pieces, one after the other, in one allocation.
std::string StrCatPieces(std::initializer_list<std::string_view> pieces);

}  // namespace internal

// Concatenates anything fmt can format ("{}"), std::string_view and absl::string_view included,
// with {fmt}'s text for each: StrCat("x=", 1.5, ' ', true) is "x=1.5 true".
template <typename... Args>
std::string StrCat(const Args&... args) {
  // Each piece is a temporary that lives until the end of this full expression.
  return internal::StrCatPieces({internal::StrCatPiece(args).view()...});
}

inline absl::string_view AsAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}
inline std::string_view AsStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace connex

#endif  // CONNEX_BASE_STRINGS_H_
