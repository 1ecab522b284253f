#include "connex/base/strings.h"

#include <charconv>
#include <type_traits>

namespace connex::internal {

namespace {

// `v` written into `buffer` as {fmt}'s "{}" writes it (integers in decimal; a floating-point
// number in its shortest form that reads back the same), viewed.
template <typename T>
std::string_view Digits(char (&buffer)[32], T v) {
  if constexpr (std::is_integral_v<T>) {
    return std::string_view(
        buffer, static_cast<size_t>(std::to_chars(buffer, buffer + 32, v).ptr - buffer));
  } else {
    return std::string_view(
        buffer, static_cast<size_t>(fmt::format_to_n(buffer, 32, "{}", v).out - buffer));
  }
}

}  // namespace

StrCatPiece::StrCatPiece(double v) : view_(Digits(buffer_, v)) {}
StrCatPiece::StrCatPiece(float v) : view_(Digits(buffer_, v)) {}
StrCatPiece::StrCatPiece(long double v) : view_(Digits(buffer_, v)) {}
std::string_view StrCatPiece::FormatSigned(int64_t v) { return Digits(buffer_, v); }
std::string_view StrCatPiece::FormatUnsigned(uint64_t v) { return Digits(buffer_, v); }

std::string StrCatPieces(std::initializer_list<std::string_view> pieces) {
  size_t size = 0;
  for (std::string_view p : pieces) size += p.size();
  std::string out;
  out.reserve(size);
  for (std::string_view p : pieces) out.append(p);
  return out;
}

}  // namespace connex::internal
