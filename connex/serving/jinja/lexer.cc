#include "connex/serving/jinja/lexer.h"

#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "connex/serving/jinja/text.h"

namespace connex::serving::jinja {
namespace {

// The template after the whitespace rules that apply before lexing, with the offset in the
// original text of every byte (for positions in errors).
struct Preprocessed {
  std::string text;
  std::vector<size_t> origin;
};

bool StartsLine(std::string_view s, size_t i) {
  if (i == 0) return true;
  const char prev = s[i - 1];
  if (prev == '\n' || prev == '\r') return true;
  // U+2028 and U+2029 end a line for JavaScript's multiline `^` too.
  return i >= 3 && static_cast<unsigned char>(s[i - 3]) == 0xE2 &&
         static_cast<unsigned char>(s[i - 2]) == 0x80 &&
         (static_cast<unsigned char>(s[i - 1]) == 0xA8 ||
          static_cast<unsigned char>(s[i - 1]) == 0xA9);
}

bool IsBlockStart(char c) { return c == '#' || c == '%' || c == '-'; }

Preprocessed Preprocess(std::string_view source) {
  // One trailing newline of the template is not part of its output.
  if (!source.empty() && source.back() == '\n') source.remove_suffix(1);
  // lstrip_blocks: spaces and tabs that start a line before `{%`, `{#` (or `{-`) go.
  Preprocessed lstripped;
  for (size_t i = 0; i < source.size();) {
    if (StartsLine(source, i)) {
      size_t j = i;
      while (j < source.size() && (source[j] == ' ' || source[j] == '\t')) ++j;
      if (j > i && j + 1 < source.size() && source[j] == '{' && IsBlockStart(source[j + 1])) {
        i = j;
      }
    }
    lstripped.text.push_back(source[i]);
    lstripped.origin.push_back(i);
    ++i;
  }
  // trim_blocks: the newline right after `%}` or `#}` (or `-}`) goes.
  Preprocessed out;
  const std::string& s = lstripped.text;
  for (size_t i = 0; i < s.size();) {
    if (i + 2 < s.size() && IsBlockStart(s[i]) && s[i + 1] == '}' && s[i + 2] == '\n') {
      for (int k = 0; k < 2; ++k) {
        out.text.push_back(s[i + k]);
        out.origin.push_back(lstripped.origin[i + k]);
      }
      i += 3;
      continue;
    }
    out.text.push_back(s[i]);
    out.origin.push_back(lstripped.origin[i]);
    ++i;
  }
  out.origin.push_back(source.size());
  return out;
}

bool IsWord(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

struct Rule {
  std::string_view text;
  TokenType type;
};

// Longest first where two share a first character, as the reference's table orders them.
constexpr std::array<Rule, 29> kRules = {{
    {"{%", TokenType::kOpenStatement},  {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},       {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurly},       {"}", TokenType::kCloseCurly},
    {"[", TokenType::kOpenSquare},      {"]", TokenType::kCloseSquare},
    {",", TokenType::kComma},           {".", TokenType::kDot},
    {":", TokenType::kColon},           {"|", TokenType::kPipe},
    {"<=", TokenType::kComparison},     {">=", TokenType::kComparison},
    {"==", TokenType::kComparison},     {"!=", TokenType::kComparison},
    {"<", TokenType::kComparison},      {">", TokenType::kComparison},
    {"+", TokenType::kAdditive},        {"-", TokenType::kAdditive},
    {"~", TokenType::kAdditive},        {"**", TokenType::kPower},
    {"*", TokenType::kMultiplicative},  {"//", TokenType::kMultiplicative},
    {"/", TokenType::kMultiplicative},  {"%", TokenType::kMultiplicative},
    {"=", TokenType::kEquals},
}};

class Lexer {
 public:
  explicit Lexer(std::string_view source) : source_(source), pre_(Preprocess(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run();

 private:
  Position PositionAt(size_t index) const {
    const size_t offset = pre_.origin[std::min(index, pre_.origin.size() - 1)];
    size_t line = 0;
    while (line + 1 < line_starts_.size() && line_starts_[line + 1] <= offset) ++line;
    return Position{static_cast<int>(line + 1), static_cast<int>(offset - line_starts_[line] + 1)};
  }
  absl::Status Error(size_t index, const std::string& what) const {
    const Position p = PositionAt(index);
    return absl::InvalidArgumentError(
        absl::StrCat("template line ", p.line, " column ", p.column, ": ", what));
  }
  char At(size_t i) const { return i < src().size() ? src()[i] : '\0'; }
  const std::string& src() const { return pre_.text; }
  void Push(TokenType type, std::string value, size_t start) {
    tokens_.push_back(Token{type, std::move(value), PositionAt(start)});
  }
  void StripTrailingWhitespace() {
    if (!tokens_.empty() && tokens_.back().type == TokenType::kText) {
      tokens_.back().value = std::string(TrimJsEnd(tokens_.back().value));
      if (tokens_.back().value.empty()) tokens_.pop_back();
    }
  }
  // Advances past whitespace; false if that reaches the end (inside a tag, an error).
  bool SkipWhitespace() {
    while (cur_ < src().size()) {
      size_t next = cur_;
      if (!IsJsWhitespace(NextCodePoint(src(), &next))) return true;
      cur_ = next;
    }
    return false;
  }
  absl::StatusOr<std::string> ReadString(char quote);
  absl::StatusOr<std::string> ReadDigits();

  std::string_view source_;
  Preprocessed pre_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t cur_ = 0;
  int curly_depth_ = 0;
};

absl::StatusOr<std::string> Lexer::ReadDigits() {
  const size_t start = cur_;
  while (IsDigit(At(cur_))) {
    if (++cur_ >= src().size()) return Error(start, "unexpected end of template in a number");
  }
  return src().substr(start, cur_ - start);
}

absl::StatusOr<std::string> Lexer::ReadString(char quote) {
  const size_t start = cur_ - 1;
  std::string out;
  while (true) {
    if (cur_ >= src().size()) return Error(start, "unterminated string literal");
    const char c = src()[cur_];
    if (c == quote) break;
    ++cur_;
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (cur_ >= src().size()) return Error(start, "unterminated string literal");
    const char escaped = src()[cur_++];
    switch (escaped) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case '\'':
      case '"':
      case '\\':
        out.push_back(escaped);
        break;
      case 'x':
      case 'u': {
        const size_t digits = escaped == 'x' ? 2 : 4;
        const std::string hex = src().substr(cur_, digits);
        if (hex.size() != digits ||
            hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
          return Error(cur_ - 2, absl::StrCat("invalid escape \\", std::string(1, escaped), hex));
        }
        AppendUtf8(static_cast<char32_t>(std::stoul(hex, nullptr, 16)), &out);
        cur_ += digits;
        break;
      }
      default:
        return Error(cur_ - 2, absl::StrCat("unknown escape \\", std::string(1, escaped)));
    }
  }
  ++cur_;  // the closing quote
  return out;
}

absl::StatusOr<std::vector<Token>> Lexer::Run() {
  const size_t length = src().size();
  while (cur_ < length) {
    const bool has_last = !tokens_.empty();
    const TokenType last = has_last ? tokens_.back().type : TokenType::kText;
    if (!has_last || last == TokenType::kCloseStatement || last == TokenType::kCloseExpression ||
        last == TokenType::kComment) {
      size_t end = cur_;
      while (true) {
        end = src().find('{', end);
        if (end == std::string::npos) {
          end = length;
          break;
        }
        const char next = At(end + 1);
        if (next == '%' || next == '{' || next == '#') break;
        ++end;
      }
      if (end > cur_) {
        Push(TokenType::kText, src().substr(cur_, end - cur_), cur_);
        cur_ = end;
        continue;
      }
    }
    if (At(cur_) == '{') {
      const char next = At(cur_ + 1);
      if (next == '#') {
        const size_t start = cur_;
        cur_ += 2;
        const bool strip_before = At(cur_) == '-';
        if (strip_before) ++cur_;
        const size_t end = src().find("#}", cur_);
        if (end == std::string::npos) return Error(start, "unterminated comment {# … #}");
        std::string comment = src().substr(cur_, end - cur_);
        const bool strip_after = !comment.empty() && comment.back() == '-';
        if (strip_after) comment.pop_back();
        if (strip_before) StripTrailingWhitespace();
        Push(TokenType::kComment, std::move(comment), start);
        cur_ = end + 2;
        if (strip_after) SkipWhitespace();
        continue;
      }
      if (At(cur_ + 2) == '-' && (next == '%' || next == '{')) {
        StripTrailingWhitespace();
        Push(next == '%' ? TokenType::kOpenStatement : TokenType::kOpenExpression,
             next == '%' ? "{%" : "{{", cur_);
        if (next == '{') curly_depth_ = 0;
        cur_ += 3;
        continue;
      }
    }
    if (!SkipWhitespace()) return Error(cur_, "unexpected end of template inside a tag");
    const size_t start = cur_;
    const char c = At(cur_);
    if (c == '-' && At(cur_ + 2) == '}' && (At(cur_ + 1) == '%' || At(cur_ + 1) == '}')) {
      Push(At(cur_ + 1) == '%' ? TokenType::kCloseStatement : TokenType::kCloseExpression,
           At(cur_ + 1) == '%' ? "%}" : "}}", start);
      cur_ += 3;
      SkipWhitespace();
      continue;
    }
    if (c == '-' || c == '+') {
      if (!has_last || last == TokenType::kText) {
        return Error(start, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
      if (last != TokenType::kIdentifier && last != TokenType::kNumber &&
          last != TokenType::kString && last != TokenType::kCloseParen &&
          last != TokenType::kCloseSquare) {
        ++cur_;
        auto digits = ReadDigits();
        if (!digits.ok()) return digits.status();
        std::string number = *digits;
        if (!number.empty() && At(cur_) == '.' && IsDigit(At(cur_ + 1))) {
          ++cur_;
          auto frac = ReadDigits();
          if (!frac.ok()) return frac.status();
          number += "." + *frac;
        }
        if (number.empty()) {
          Push(TokenType::kUnary, std::string(1, c), start);
        } else {
          Push(TokenType::kNumber, std::string(1, c) + number, start);
        }
        continue;
      }
    }
    bool matched = false;
    for (const Rule& rule : kRules) {
      if (rule.text == "}}" && curly_depth_ > 0) continue;
      if (std::string_view(src()).substr(cur_, rule.text.size()) != rule.text) continue;
      if (rule.type == TokenType::kOpenExpression) curly_depth_ = 0;
      if (rule.type == TokenType::kOpenCurly) ++curly_depth_;
      if (rule.type == TokenType::kCloseCurly) --curly_depth_;
      Push(rule.type, std::string(rule.text), start);
      cur_ += rule.text.size();
      matched = true;
      break;
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      ++cur_;
      auto text = ReadString(c);
      if (!text.ok()) return text.status();
      Push(TokenType::kString, *std::move(text), start);
      continue;
    }
    if (IsDigit(c)) {
      auto digits = ReadDigits();
      if (!digits.ok()) return digits.status();
      std::string number = *digits;
      if (last != TokenType::kDot && At(cur_) == '.' && IsDigit(At(cur_ + 1))) {
        ++cur_;
        auto frac = ReadDigits();
        if (!frac.ok()) return frac.status();
        number += "." + *frac;
      }
      Push(TokenType::kNumber, std::move(number), start);
      continue;
    }
    if (IsWord(c)) {
      while (cur_ < length && IsWord(At(cur_))) ++cur_;
      if (cur_ >= length) return Error(start, "unexpected end of template inside a tag");
      Push(TokenType::kIdentifier, src().substr(start, cur_ - start), start);
      continue;
    }
    size_t next = cur_;
    std::string bad;
    AppendUtf8(NextCodePoint(src(), &next), &bad);
    return Error(start, absl::StrCat("unexpected character '", bad, "'"));
  }
  return std::move(tokens_);
}

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) { return Lexer(source).Run(); }

std::string_view TokenTypeName(TokenType type) {
  switch (type) {
    case TokenType::kText:
      return "text";
    case TokenType::kComment:
      return "comment";
    case TokenType::kOpenStatement:
      return "'{%'";
    case TokenType::kCloseStatement:
      return "'%}'";
    case TokenType::kOpenExpression:
      return "'{{'";
    case TokenType::kCloseExpression:
      return "'}}'";
    case TokenType::kNumber:
      return "number";
    case TokenType::kString:
      return "string";
    case TokenType::kIdentifier:
      return "name";
    case TokenType::kOpenParen:
      return "'('";
    case TokenType::kCloseParen:
      return "')'";
    case TokenType::kOpenCurly:
      return "'{'";
    case TokenType::kCloseCurly:
      return "'}'";
    case TokenType::kOpenSquare:
      return "'['";
    case TokenType::kCloseSquare:
      return "']'";
    case TokenType::kComma:
      return "','";
    case TokenType::kDot:
      return "'.'";
    case TokenType::kColon:
      return "':'";
    case TokenType::kPipe:
      return "'|'";
    case TokenType::kComparison:
      return "comparison";
    case TokenType::kAdditive:
      return "'+', '-' or '~'";
    case TokenType::kMultiplicative:
      return "'*', '/', '//' or '%'";
    case TokenType::kPower:
      return "'**'";
    case TokenType::kEquals:
      return "'='";
    case TokenType::kUnary:
      return "sign";
  }
  return "?";
}

}  // namespace connex::serving::jinja
