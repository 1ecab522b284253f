// The lexer of the Jinja subset that Hugging Face chat templates use. It applies the whitespace
// rules those templates are rendered with (transformers' trim_blocks and lstrip_blocks, the `-`
// markers, and the removal of one trailing newline, as @huggingface/jinja does) and splits the
// result into text and the tokens inside `{{ }}`, `{% %}` and `{# #}`. Thread-safe (pure).
#ifndef CONNEX_SERVING_JINJA_LEXER_H_
#define CONNEX_SERVING_JINJA_LEXER_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::serving::jinja {

// A place in the template as written (1-based line and column, in bytes).
struct Position {
  int line = 1;
  int column = 1;
};

enum class TokenType {
  kText,
  kComment,
  kOpenStatement,    // {%
  kCloseStatement,   // %}
  kOpenExpression,   // {{
  kCloseExpression,  // }}
  kNumber,
  kString,
  kIdentifier,
  kOpenParen,
  kCloseParen,
  kOpenCurly,
  kCloseCurly,
  kOpenSquare,
  kCloseSquare,
  kComma,
  kDot,
  kColon,
  kPipe,
  kComparison,      // < > <= >= == !=
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kEquals,          // =
  kUnary,           // a sign with no number after it
};

struct Token {
  TokenType type;
  std::string value;
  Position position;
};

// InvalidArgument naming the line and column of an unexpected character, an unterminated string
// or comment, or a bad escape.
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

std::string_view TokenTypeName(TokenType type);

}  // namespace connex::serving::jinja

#endif  // CONNEX_SERVING_JINJA_LEXER_H_
