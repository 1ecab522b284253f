// The regular expressions of tokenizer.json (Split pre-tokenizers, Replace normalizers and
// decoders), compiled with PCRE2 in UTF + UCP mode so that they mean what they mean to the
// JavaScript reference (transformers.js, which runs them as `u`-flag RegExps). Thread-safe: a
// compiled Regex is immutable; each search allocates its own match data.
#ifndef CONNEX_ENGINE_INTERNAL_HF_REGEX_H_
#define CONNEX_ENGINE_INTERNAL_HF_REGEX_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::engine::internal {

// The PCRE2 pattern that matches what `js_pattern` matches as a JavaScript `u` RegExp: `\s`, `\S`,
// `\d`, `\w` and their negations get JavaScript's sets (PCRE2's UCP sets differ: U+0085, U+180E,
// U+FEFF, non-ASCII digits and letters), and the case-insensitive contraction group of the
// GPT-4-style patterns is made ASCII-only, as transformers.js rewrites it. InvalidArgument for
// what the translation does not handle (`\b`, `\B`, `\S` inside a class).
absl::StatusOr<std::string> TranslateJsPattern(std::string_view js_pattern);

class Regex {
 public:
  // Compiles a pattern of tokenizer.json (after TranslateJsPattern). InvalidArgument with
  // PCRE2's message and offset if it does not compile.
  static absl::StatusOr<Regex> Compile(std::string_view js_pattern);
  // A literal string (the `{"String": ...}` form of a pattern).
  static absl::StatusOr<Regex> Literal(std::string_view text);

  struct Match {
    size_t begin;
    size_t end;
  };
  // Every non-overlapping match in `text` (valid UTF-8), left to right; after an empty match the
  // search moves on one character, as JavaScript's matchAll does. ResourceExhausted if PCRE2's
  // match limits are hit.
  absl::StatusOr<std::vector<Match>> FindAll(std::string_view text) const;

  // `text` with every match replaced by `replacement` (taken literally).
  absl::StatusOr<std::string> ReplaceAll(std::string_view text, std::string_view replacement) const;

 private:
  struct Code;
  explicit Regex(std::shared_ptr<const Code> code) : code_(std::move(code)) {}
  std::shared_ptr<const Code> code_;
};

}  // namespace connex::engine::internal

#endif  // CONNEX_ENGINE_INTERNAL_HF_REGEX_H_
