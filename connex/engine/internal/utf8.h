// UTF-8 helpers of the tokenizers: validation, code point iteration, the WHATWG decoder that
// turns any byte string into valid UTF-8 (each maximal ill-formed subpart becomes U+FFFD, as
// JavaScript's TextDecoder and Python's "replace" do), and the GPT-2 byte-to-character map of
// byte-level BPE. Thread-safe (pure functions over immutable tables).
#ifndef CONNEX_ENGINE_INTERNAL_UTF8_H_
#define CONNEX_ENGINE_INTERNAL_UTF8_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace connex::engine::internal {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// The byte offset of the first byte that is not part of a well-formed UTF-8 sequence (overlong
// forms, surrogates and code points above U+10FFFF are ill-formed), or nullopt if `s` is valid.
std::optional<size_t> FindInvalidUtf8(std::string_view s);

// The code point at `s[*pos]`, advancing `*pos` past it. `s` must be valid UTF-8.
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

// GPT-2's byte-level alphabet: byte b is written as the character ByteToChar()[b] (printable
// bytes as themselves, the others shifted to U+0100 and up), so that every byte string is a string
// of visible characters.
const std::array<char32_t, 256>& ByteToChar();
// The byte written as `cp`, or -1 if `cp` is not in the byte-level alphabet.
int CharToByte(char32_t cp);

}  // namespace connex::engine::internal

#endif  // CONNEX_ENGINE_INTERNAL_UTF8_H_
