// The tokenizers' UTF-8 helpers: connex/base/utf8.h's (validation, code point iteration, the
// WHATWG decoder, JavaScript white space), and the GPT-2 byte-to-character map of byte-level
// BPE. Thread-safe (pure functions over immutable tables).
#ifndef CONNEX_ENGINE_INTERNAL_UTF8_H_
#define CONNEX_ENGINE_INTERNAL_UTF8_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "connex/base/utf8.h"

namespace connex::engine::internal {

// The UTF-8 helpers of connex/base/utf8.h, by their names here.
using ::connex::AppendUtf8;
using ::connex::DecodeUtf8Lossy;
using ::connex::FindInvalidUtf8;
using ::connex::IsJsWhitespace;
using ::connex::kReplacementChar;
using ::connex::NextCodePoint;
using ::connex::TrimJsEnd;
using ::connex::TrimJsStart;

// GPT-2's byte-level alphabet: byte b is written as the character ByteToChar()[b] (printable
// bytes as themselves, the others shifted to U+0100 and up), so that every byte string is a string
// of visible characters.
const std::array<char32_t, 256>& ByteToChar();
// The byte written as `cp`, or -1 if `cp` is not in the byte-level alphabet.
int CharToByte(char32_t cp);

}  // namespace connex::engine::internal

#endif  // CONNEX_ENGINE_INTERNAL_UTF8_H_
