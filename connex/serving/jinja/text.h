// JavaScript string semantics over UTF-8 text, for the Jinja interpreter: the reference
// implementation of chat templates (@huggingface/jinja) runs on JavaScript strings, so trimming,
// lengths, slicing and JSON quoting follow JavaScript's rules here. Thread-safe (pure functions).
#ifndef CONNEX_SERVING_JINJA_TEXT_H_
#define CONNEX_SERVING_JINJA_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "connex/base/utf8.h"

namespace connex::serving::jinja {

// Code points (an ill-formed sequence reads as one U+FFFD), UTF-8 encoding and JavaScript's
// white space and trimming: connex/base/utf8.h's.
using ::connex::AppendUtf8;
using ::connex::IsJsWhitespace;
using ::connex::NextCodePoint;
using ::connex::TrimJsEnd;
using ::connex::TrimJsStart;

// Length in UTF-16 code units, as JavaScript's `length`.
size_t Utf16Length(std::string_view text);

// Both ends' JavaScript white space removed (String.prototype.trim).
std::string_view TrimJs(std::string_view text);

// The code points of `text`, each as its UTF-8 bytes (JavaScript's Array.from(string)).
std::vector<std::string_view> SplitCodePoints(std::string_view text);

// ASCII case mapping (the chat templates only case-map ASCII role names); other bytes are kept.
std::string AsciiUpper(std::string_view text);
std::string AsciiLower(std::string_view text);

// JSON.stringify of a string; with `ensure_ascii`, every code unit above 0x7e is \uXXXX-escaped
// (astral code points as their surrogate pair), as Python's json.dumps(ensure_ascii=True).
std::string JsonQuote(std::string_view text, bool ensure_ascii = false);

// JavaScript's Number.prototype.toString of a double.
std::string JsNumberToString(double value);

}  // namespace connex::serving::jinja

#endif  // CONNEX_SERVING_JINJA_TEXT_H_
