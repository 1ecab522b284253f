// UTF-8 helpers: validation, code point iteration, the WHATWG decoder that turns any byte string
// into valid UTF-8 (each maximal ill-formed subpart becomes U+FFFD, as JavaScript's TextDecoder
// and Python's "replace" do), and JavaScript's white space. Shared by the tokenizers
// (connex/engine) and the chat templates (connex/serving/jinja). Thread-safe (pure functions).
#ifndef CONNEX_BASE_UTF8_H_
#define CONNEX_BASE_UTF8_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace connex {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// The byte offset of the first byte that is not part of a well-formed UTF-8 sequence (overlong
// forms, surrogates and code points above U+10FFFF are ill-formed), or nullopt if `s` is valid.
std::optional<size_t> FindInvalidUtf8(std::string_view s);

// The code point at `s[*pos]` (*pos < s.size()), advancing `*pos` past it; an ill-formed
// sequence reads as one U+FFFD for its maximal subpart (as DecodeUtf8Lossy).
char32_t NextCodePoint(std::string_view s, size_t* pos);

// Appends the UTF-8 encoding of `cp` (a scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// Decodes `bytes` as UTF-8 the way the WHATWG Encoding standard does with replacement: the result
// is valid UTF-8. With `strip_bom`, a U+FEFF decoded from the first three bytes is dropped (a
// TextDecoder that does not ignore the BOM).
std::string DecodeUtf8Lossy(std::string_view bytes, bool strip_bom = false);

// Whether `cp` is white space for JavaScript (`\s`, `String.prototype.trim`): tab, LF, VT, FF,
// CR, space, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF.
bool IsJsWhitespace(char32_t cp);

// `s` without its leading / trailing JavaScript white space (`trimStart` / `trimEnd`).
std::string_view TrimJsStart(std::string_view s);
std::string_view TrimJsEnd(std::string_view s);

}  // namespace connex

#endif  // CONNEX_BASE_UTF8_H_
