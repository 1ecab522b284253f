#include "connex/engine/internal/hf_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_replace.h"
#include "connex/base/strings.h"

namespace connex::engine::internal {
namespace {

// JavaScript's white space (ECMAScript WhiteSpace and LineTerminator), as class items.
constexpr std::string_view kJsSpace =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}\\x{FEFF}";
constexpr std::string_view kJsDigit = "0-9";
constexpr std::string_view kJsWord = "A-Za-z0-9_";

// The contraction group of the Llama 3 / Qwen patterns: `(?i:...)` is not JavaScript, and
// transformers.js replaces it with ASCII-only alternatives (PCRE2's caseless mode would also
// match U+017F for `s` and U+212A for `k`).
constexpr std::string_view kCaselessContractions = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
constexpr std::string_view kAsciiContractions =
    "(?:'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

absl::StatusOr<std::string> TranslateJsPattern(std::string_view js_pattern) {
  std::string pattern = absl::StrReplaceAll(
      AsAbsl(js_pattern), {{AsAbsl(kCaselessContractions), AsAbsl(kAsciiContractions)}});
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[++i];
      std::string_view set;
      bool negated = e == 'S' || e == 'D' || e == 'W';
      switch (e) {
        case 's':
        case 'S':
          set = kJsSpace;
          break;
        case 'd':
        case 'D':
          set = kJsDigit;
          break;
        case 'w':
        case 'W':
          set = kJsWord;
          break;
        case 'b':
        case 'B':
          return absl::InvalidArgumentError(StrCat("regex \"", js_pattern, "\": \\",
                                                   std::string(1, e),
                                                   " (a word boundary) is not supported"));
        case 'u':
          // JavaScript's \uXXXX and \u{X...} are PCRE2's \x{...}.
          if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
            out.append("\\x");
          } else if (i + 4 < pattern.size()) {
            out += StrCat("\\x{", pattern.substr(i + 1, 4), "}");
            i += 4;
          } else {
            out.append("\\u");
          }
          continue;
        default:
          out.push_back('\\');
          out.push_back(e);
          continue;
      }
      if (in_class) {
        if (negated) {
          return absl::InvalidArgumentError(StrCat("regex \"", js_pattern, "\": \\",
                                                   std::string(1, e),
                                                   " inside a class is not supported"));
        }
        out.append(set);
      } else {
        out += StrCat(negated ? "[^" : "[", set, "]");
      }
      continue;
    }
    if (in_class && c == ']') {
      in_class = false;
    } else if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A `]` or `^]` right after the opening bracket is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    out.push_back(c);
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

absl::StatusOr<Regex> Regex::Compile(std::string_view js_pattern) {
  absl::StatusOr<std::string> pattern = TranslateJsPattern(js_pattern);
  if (!pattern.ok()) return pattern.status();
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern->data()), pattern->size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code->code == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("regex \"", js_pattern, "\": ", Pcre2Error(error), " at offset ", offset));
  }
  // JIT is an optimisation only: a pattern it cannot compile runs interpreted.
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  return Regex(std::move(code));
}

absl::StatusOr<Regex> Regex::Literal(std::string_view text) {
  std::string quoted;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos)
      quoted.push_back('\\');
    quoted.push_back(c);
  }
  return Compile(quoted);
}

absl::StatusOr<std::vector<Regex::Match>> Regex::FindAll(std::string_view text) const {
  std::vector<Match> matches;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(),
                         nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       data.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(
          StrCat("regex search over ", text.size(), " bytes failed: ", Pcre2Error(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    Match m{ovector[0], ovector[1]};
    matches.push_back(m);
    if (m.end > m.begin) {
      start = m.end;
    } else {
      // Step over one whole character.
      start = m.end + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        ++start;
      }
    }
  }
  return matches;
}

absl::StatusOr<std::string> Regex::ReplaceAll(std::string_view text,
                                              std::string_view replacement) const {
  absl::StatusOr<std::vector<Match>> matches = FindAll(text);
  if (!matches.ok()) return matches.status();
  std::string out;
  size_t prev = 0;
  for (const Match& m : *matches) {
    out.append(text.substr(prev, m.begin - prev));
    out.append(replacement);
    prev = m.end;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace connex::engine::internal
