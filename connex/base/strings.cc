#include "connex/base/strings.h"

#include <charconv>

namespace connex::internal {

StrCatPiece::StrCatPiece(double v) {
  char* end = fmt::format_to_n(buffer_, sizeof(buffer_), "{}", v).out;
  view_ = std::string_view(buffer_, static_cast<size_t>(end - buffer_));
}

StrCatPiece::StrCatPiece(float v) {
  char* end = fmt::format_to_n(buffer_, sizeof(buffer_), "{}", v).out;
  view_ = std::string_view(buffer_, static_cast<size_t>(end - buffer_));
}

std::string_view StrCatPiece::FormatSigned(int64_t v) {
  const std::to_chars_result r = std::to_chars(buffer_, buffer_ + sizeof(buffer_), v);
  return std::string_view(buffer_, static_cast<size_t>(r.ptr - buffer_));
}

std::string_view StrCatPiece::FormatUnsigned(uint64_t v) {
  const std::to_chars_result r = std::to_chars(buffer_, buffer_ + sizeof(buffer_), v);
  return std::string_view(buffer_, static_cast<size_t>(r.ptr - buffer_));
}

std::string StrCatPieces(std::initializer_list<std::string_view> pieces) {
  size_t size = 0;
  for (std::string_view p : pieces) size += p.size();
  std::string out;
  out.reserve(size);
  for (std::string_view p : pieces) out.append(p);
  return out;
}

}  // namespace connex::internal
