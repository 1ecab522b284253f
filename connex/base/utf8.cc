// UTF-8 helpers shared by the tokenizers (connex/engine) and the chat templates
// (connex/serving/jinja): see utf8.h.
#include "connex/base/utf8.h"

namespace connex {
namespace {

// The length of the sequence that `lead` opens and the bounds of its second byte (which exclude
// overlong forms, surrogates and values above U+10FFFF), or length 0 for a byte that opens none.
struct LeadInfo {
  int length;
  unsigned char lower;
  unsigned char upper;
};

LeadInfo Lead(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  return {0, 0, 0};
}

// The length of the longest prefix of `s` at `pos` that is a well-formed sequence or a prefix of
// one (its maximal subpart), and whether it is complete.
size_t MaximalSubpart(std::string_view s, size_t pos, bool* complete) {
  LeadInfo lead = Lead(static_cast<unsigned char>(s[pos]));
  *complete = lead.length == 1;
  if (lead.length <= 1) return 1;
  size_t n = 1;
  for (; n < static_cast<size_t>(lead.length) && pos + n < s.size(); ++n) {
    unsigned char b = static_cast<unsigned char>(s[pos + n]);
    unsigned char lower = n == 1 ? lead.lower : 0x80;
    unsigned char upper = n == 1 ? lead.upper : 0xBF;
    if (b < lower || b > upper) return n;
  }
  *complete = n == static_cast<size_t>(lead.length);
  return n;
}

}  // namespace

std::optional<size_t> FindInvalidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    bool complete = false;
    size_t n = MaximalSubpart(s, pos, &complete);
    if (!complete) return pos;
    pos += n;
  }
  return std::nullopt;
}

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  unsigned char b = static_cast<unsigned char>(s[*pos]);
  if (b < 0x80) {
    ++*pos;
    return b;
  }
  bool complete = false;
  const size_t n = MaximalSubpart(s, *pos, &complete);
  if (!complete) {
    *pos += n;  // an ill-formed subpart: one replacement character, as the WHATWG decoder
    return kReplacementChar;
  }
  char32_t cp = b & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + i]) & 0x3F);
  }
  *pos += n;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string DecodeUtf8Lossy(std::string_view bytes, bool strip_bom) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  if (strip_bom && bytes.substr(0, 3) == "\xEF\xBB\xBF") pos = 3;
  while (pos < bytes.size()) {
    if (static_cast<unsigned char>(bytes[pos]) < 0x80) {
      out.push_back(bytes[pos++]);
      continue;
    }
    bool complete = false;
    size_t n = MaximalSubpart(bytes, pos, &complete);
    if (complete) {
      out.append(bytes.substr(pos, n));
    } else {
      AppendUtf8(kReplacementChar, &out);
    }
    pos += n;
  }
  return out;
}

bool IsJsWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view TrimJsStart(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsJsWhitespace(NextCodePoint(s, &next))) break;
    pos = next;
  }
  return s.substr(pos);
}

std::string_view TrimJsEnd(std::string_view s) {
  size_t end = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    if (!IsJsWhitespace(NextCodePoint(s, &pos))) end = pos;
  }
  return s.substr(0, end);
}

}  // namespace connex
