#include "connex/serving/jinja/parser.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "connex/base/status.h"

namespace connex::serving::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  absl::StatusOr<std::vector<NodePtr>> Run() {
    std::vector<NodePtr> program;
    while (current_ < tokens_.size()) {
      CONNEX_ASSIGN_OR_RETURN(NodePtr node, ParseAny());
      program.push_back(std::move(node));
    }
    return program;
  }

 private:
  using Result = absl::StatusOr<NodePtr>;

  bool Is(TokenType type, size_t ahead = 0) const {
    return current_ + ahead < tokens_.size() && tokens_[current_ + ahead].type == type;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Is(TokenType::kIdentifier, ahead) && tokens_[current_ + ahead].value == name;
  }
  // `{% name` for one of the names.
  bool IsStatement(std::initializer_list<std::string_view> names) const {
    if (!Is(TokenType::kOpenStatement)) return false;
    for (std::string_view name : names) {
      if (IsName(name, 1)) return true;
    }
    return false;
  }
  Position Here() const {
    if (current_ < tokens_.size()) return tokens_[current_].position;
    return tokens_.empty() ? Position{} : tokens_.back().position;
  }
  absl::Status Error(const std::string& what) const {
    const Position p = Here();
    std::string found = "the end of the template";
    if (current_ < tokens_.size()) {
      const Token& t = tokens_[current_];
      found = t.type == TokenType::kIdentifier || t.type == TokenType::kComparison
                  ? absl::StrCat("'", t.value, "'")
                  : std::string(TokenTypeName(t.type));
    }
    return absl::InvalidArgumentError(absl::StrCat("template line ", p.line, " column ", p.column,
                                                   ": ", what, ", found ", found));
  }
  absl::Status Expect(TokenType type, const std::string& what) {
    if (!Is(type)) return Error(absl::StrCat("expected ", what));
    ++current_;
    return absl::OkStatus();
  }
  absl::Status ExpectName(const std::string& name) {
    if (!IsName(name)) return Error(absl::StrCat("expected '", name, "'"));
    ++current_;
    return absl::OkStatus();
  }
  NodePtr Make(NodeKind kind, Position position) {
    auto node = std::make_unique<Node>();
    node->kind = kind;
    node->position = position;
    return node;
  }
  // Statements until one of `names` opens a tag; an error if the template ends first.
  absl::Status ParseBlock(std::initializer_list<std::string_view> names, std::vector<NodePtr>* out,
                          const std::string& what) {
    while (!IsStatement(names)) {
      if (current_ >= tokens_.size()) return Error(absl::StrCat("missing ", what));
      CONNEX_ASSIGN_OR_RETURN(NodePtr node, ParseAny());
      out->push_back(std::move(node));
    }
    return absl::OkStatus();
  }

  Result ParseAny();
  Result ParseStatement();
  Result ParseSet(Position position);
  Result ParseIf(Position position);
  Result ParseFor(Position position);
  Result ParseSequence(bool primary);
  Result ParseExpression();
  Result ParseOr();
  Result ParseAnd();
  Result ParseNot();
  Result ParseComparison();
  Result ParseAdditive();
  Result ParseMultiplicative();
  Result ParsePower();
  Result ParseTest();
  Result ParseFilter();
  Result ParseSign();
  Result ParseCallMember();
  Result ParseCall(NodePtr callee);
  Result ParseMember(NodePtr object);
  Result ParseSubscript();
  Result ParsePrimary();

  const std::vector<Token>& tokens_;
  // Statements, expressions, `not`s and signs nest at most this deep: a template is read from a
  // model's directory, and one nested without bound would overflow the stack of the parser and of
  // the evaluator that walks its tree.
  static constexpr int kMaxDepth = 200;
  class DepthGuard {
   public:
    explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
    ~DepthGuard() { --*depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    int* depth_;
  };
  absl::Status CheckDepth() const {
    if (depth_ > kMaxDepth) {
      return Error(absl::StrCat("the template nests deeper than ", kMaxDepth, " levels"));
    }
    return absl::OkStatus();
  }

  size_t current_ = 0;
  int depth_ = 0;
};

Parser::Result Parser::ParseAny() {
  DepthGuard guard(&depth_);
  CONNEX_RETURN_IF_ERROR(CheckDepth());
  const Token& token = tokens_[current_];
  switch (token.type) {
    case TokenType::kComment:
      ++current_;
      return Make(NodeKind::kComment, token.position);
    case TokenType::kText: {
      NodePtr node = Make(NodeKind::kText, token.position);
      node->text = token.value;
      ++current_;
      return node;
    }
    case TokenType::kOpenStatement:
      return ParseStatement();
    case TokenType::kOpenExpression: {
      ++current_;
      CONNEX_ASSIGN_OR_RETURN(NodePtr node, ParseExpression());
      CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseExpression, "'}}'"));
      return node;
    }
    default:
      return Error("expected text, '{{' or '{%'");
  }
}

Parser::Result Parser::ParseStatement() {
  const Position position = Here();
  ++current_;  // {%
  if (!Is(TokenType::kIdentifier)) return Error("expected a statement name after '{%'");
  const std::string name = tokens_[current_].value;
  ++current_;
  if (name == "set") return ParseSet(position);
  if (name == "if") {
    CONNEX_ASSIGN_OR_RETURN(NodePtr node, ParseIf(position));
    CONNEX_RETURN_IF_ERROR(Expect(TokenType::kOpenStatement, "'{%'"));
    CONNEX_RETURN_IF_ERROR(ExpectName("endif"));
    CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    return node;
  }
  if (name == "for") {
    CONNEX_ASSIGN_OR_RETURN(NodePtr node, ParseFor(position));
    CONNEX_RETURN_IF_ERROR(Expect(TokenType::kOpenStatement, "'{%'"));
    CONNEX_RETURN_IF_ERROR(ExpectName("endfor"));
    CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    return node;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "template line ", position.line, " column ", position.column, ": statement '{% ", name,
      " %}' is not in the supported Jinja subset (if/elif/else, for/else, set)"));
}

Parser::Result Parser::ParseSet(Position position) {
  NodePtr node = Make(NodeKind::kSet, position);
  CONNEX_ASSIGN_OR_RETURN(NodePtr target, ParseSequence(/*primary=*/false));
  node->children.push_back(std::move(target));
  if (Is(TokenType::kEquals)) {
    ++current_;
    CONNEX_ASSIGN_OR_RETURN(NodePtr value, ParseSequence(/*primary=*/false));
    node->children.push_back(std::move(value));
  } else {
    node->children.push_back(nullptr);
    CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'=' or '%}' in a set"));
    CONNEX_RETURN_IF_ERROR(ParseBlock({"endset"}, &node->body, "{% endset %}"));
    ++current_;  // {%
    ++current_;  // endset
  }
  CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
  return node;
}

Parser::Result Parser::ParseIf(Position position) {
  NodePtr node = Make(NodeKind::kIf, position);
  CONNEX_ASSIGN_OR_RETURN(NodePtr test, ParseExpression());
  node->children.push_back(std::move(test));
  CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}' after the if condition"));
  CONNEX_RETURN_IF_ERROR(ParseBlock({"elif", "else", "endif"}, &node->body, "{% endif %}"));
  if (IsStatement({"elif"})) {
    const Position elif_position = Here();
    current_ += 2;
    CONNEX_ASSIGN_OR_RETURN(NodePtr elif, ParseIf(elif_position));
    node->alternate.push_back(std::move(elif));
  } else if (IsStatement({"else"})) {
    current_ += 2;
    CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}' after else"));
    CONNEX_RETURN_IF_ERROR(ParseBlock({"endif"}, &node->alternate, "{% endif %}"));
  }
  return node;
}

Parser::Result Parser::ParseFor(Position position) {
  NodePtr node = Make(NodeKind::kFor, position);
  CONNEX_ASSIGN_OR_RETURN(NodePtr target, ParseSequence(/*primary=*/true));
  if (target->kind != NodeKind::kIdentifier && target->kind != NodeKind::kTuple) {
    return Error("expected a name or a tuple of names as the loop variable");
  }
  node->children.push_back(std::move(target));
  CONNEX_RETURN_IF_ERROR(ExpectName("in"));
  CONNEX_ASSIGN_OR_RETURN(NodePtr iterable, ParseExpression());
  node->children.push_back(std::move(iterable));
  CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}' after the for loop's iterable"));
  CONNEX_RETURN_IF_ERROR(ParseBlock({"endfor", "else"}, &node->body, "{% endfor %}"));
  if (IsStatement({"else"})) {
    current_ += 2;
    CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}' after else"));
    CONNEX_RETURN_IF_ERROR(ParseBlock({"endfor"}, &node->alternate, "{% endfor %}"));
  }
  return node;
}

Parser::Result Parser::ParseSequence(bool primary) {
  const Position position = Here();
  CONNEX_ASSIGN_OR_RETURN(NodePtr first, primary ? ParsePrimary() : ParseExpression());
  if (!Is(TokenType::kComma)) return first;
  NodePtr tuple = Make(NodeKind::kTuple, position);
  tuple->children.push_back(std::move(first));
  while (Is(TokenType::kComma)) {
    ++current_;
    CONNEX_ASSIGN_OR_RETURN(NodePtr next, primary ? ParsePrimary() : ParseExpression());
    tuple->children.push_back(std::move(next));
  }
  return tuple;
}

Parser::Result Parser::ParseExpression() {
  DepthGuard guard(&depth_);
  CONNEX_RETURN_IF_ERROR(CheckDepth());
  const Position position = Here();
  CONNEX_ASSIGN_OR_RETURN(NodePtr value, ParseOr());
  if (!IsName("if")) return value;
  ++current_;
  CONNEX_ASSIGN_OR_RETURN(NodePtr test, ParseOr());
  if (IsName("else")) {
    ++current_;
    CONNEX_ASSIGN_OR_RETURN(NodePtr otherwise, ParseExpression());
    NodePtr node = Make(NodeKind::kTernary, position);
    node->children.push_back(std::move(test));
    node->children.push_back(std::move(value));
    node->children.push_back(std::move(otherwise));
    return node;
  }
  NodePtr node = Make(NodeKind::kSelect, position);
  node->children.push_back(std::move(value));
  node->children.push_back(std::move(test));
  return node;
}

namespace {

NodePtr MakeBinary(std::string op, Position position, NodePtr left, NodePtr right) {
  auto node = std::make_unique<Node>();
  node->kind = NodeKind::kBinary;
  node->position = position;
  node->text = std::move(op);
  node->children.push_back(std::move(left));
  node->children.push_back(std::move(right));
  return node;
}

}  // namespace

Parser::Result Parser::ParseOr() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr left, ParseAnd());
  while (IsName("or")) {
    const Position position = Here();
    ++current_;
    CONNEX_ASSIGN_OR_RETURN(NodePtr right, ParseAnd());
    left = MakeBinary("or", position, std::move(left), std::move(right));
  }
  return left;
}

Parser::Result Parser::ParseAnd() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr left, ParseNot());
  while (IsName("and")) {
    const Position position = Here();
    ++current_;
    CONNEX_ASSIGN_OR_RETURN(NodePtr right, ParseNot());
    left = MakeBinary("and", position, std::move(left), std::move(right));
  }
  return left;
}

Parser::Result Parser::ParseNot() {
  DepthGuard guard(&depth_);
  CONNEX_RETURN_IF_ERROR(CheckDepth());
  if (!IsName("not")) return ParseComparison();
  NodePtr node = Make(NodeKind::kUnary, Here());
  node->text = "not";
  ++current_;
  CONNEX_ASSIGN_OR_RETURN(NodePtr argument, ParseNot());
  node->children.push_back(std::move(argument));
  return node;
}

Parser::Result Parser::ParseComparison() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr left, ParseAdditive());
  while (true) {
    const Position position = Here();
    std::string op;
    if (IsName("not") && IsName("in", 1)) {
      op = "not in";
      current_ += 2;
    } else if (IsName("in")) {
      op = "in";
      ++current_;
    } else if (Is(TokenType::kComparison)) {
      op = tokens_[current_++].value;
    } else {
      return left;
    }
    CONNEX_ASSIGN_OR_RETURN(NodePtr right, ParseAdditive());
    left = MakeBinary(std::move(op), position, std::move(left), std::move(right));
  }
}

Parser::Result Parser::ParseAdditive() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr left, ParseMultiplicative());
  while (Is(TokenType::kAdditive)) {
    const Position position = Here();
    std::string op = tokens_[current_++].value;
    CONNEX_ASSIGN_OR_RETURN(NodePtr right, ParseMultiplicative());
    left = MakeBinary(std::move(op), position, std::move(left), std::move(right));
  }
  return left;
}

Parser::Result Parser::ParseMultiplicative() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr left, ParsePower());
  while (Is(TokenType::kMultiplicative)) {
    const Position position = Here();
    std::string op = tokens_[current_++].value;
    CONNEX_ASSIGN_OR_RETURN(NodePtr right, ParsePower());
    left = MakeBinary(std::move(op), position, std::move(left), std::move(right));
  }
  return left;
}

Parser::Result Parser::ParsePower() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr left, ParseTest());
  while (Is(TokenType::kPower)) {
    const Position position = Here();
    ++current_;
    CONNEX_ASSIGN_OR_RETURN(NodePtr right, ParseTest());
    left = MakeBinary("**", position, std::move(left), std::move(right));
  }
  return left;
}

Parser::Result Parser::ParseTest() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr operand, ParseFilter());
  while (IsName("is")) {
    NodePtr node = Make(NodeKind::kTest, Here());
    ++current_;
    if (IsName("not")) {
      node->negate = true;
      ++current_;
    }
    if (!Is(TokenType::kIdentifier)) return Error("expected the name of a test after 'is'");
    node->text = tokens_[current_++].value;
    node->children.push_back(std::move(operand));
    operand = std::move(node);
  }
  return operand;
}

Parser::Result Parser::ParseFilter() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr operand, ParseSign());
  while (Is(TokenType::kPipe)) {
    NodePtr node = Make(NodeKind::kFilter, Here());
    ++current_;
    if (!Is(TokenType::kIdentifier)) return Error("expected the name of a filter after '|'");
    NodePtr filter = Make(NodeKind::kIdentifier, Here());
    filter->text = tokens_[current_++].value;
    if (Is(TokenType::kOpenParen)) {
      CONNEX_ASSIGN_OR_RETURN(filter, ParseCall(std::move(filter)));
    }
    node->children.push_back(std::move(operand));
    node->children.push_back(std::move(filter));
    operand = std::move(node);
  }
  return operand;
}

Parser::Result Parser::ParseSign() {
  DepthGuard guard(&depth_);
  CONNEX_RETURN_IF_ERROR(CheckDepth());
  if ((Is(TokenType::kUnary) || Is(TokenType::kAdditive)) &&
      (tokens_[current_].value == "-" || tokens_[current_].value == "+")) {
    NodePtr node = Make(NodeKind::kUnary, Here());
    node->text = tokens_[current_++].value;
    CONNEX_ASSIGN_OR_RETURN(NodePtr argument, ParseSign());
    node->children.push_back(std::move(argument));
    return node;
  }
  return ParseCallMember();
}

Parser::Result Parser::ParseCallMember() {
  CONNEX_ASSIGN_OR_RETURN(NodePtr primary, ParsePrimary());
  CONNEX_ASSIGN_OR_RETURN(NodePtr member, ParseMember(std::move(primary)));
  if (Is(TokenType::kOpenParen)) return ParseCall(std::move(member));
  return member;
}

Parser::Result Parser::ParseCall(NodePtr callee) {
  NodePtr call = Make(NodeKind::kCall, callee->position);
  call->children.push_back(std::move(callee));
  ++current_;  // (
  bool saw_keyword = false;
  while (!Is(TokenType::kCloseParen)) {
    if (current_ >= tokens_.size()) return Error("expected ')' to close the call");
    if (Is(TokenType::kPower) ||
        (Is(TokenType::kMultiplicative) && tokens_[current_].value == "*")) {
      return Error("argument unpacking (* and **) is not in the supported Jinja subset");
    }
    const Position position = Here();
    CONNEX_ASSIGN_OR_RETURN(NodePtr argument, ParseExpression());
    if (Is(TokenType::kEquals)) {
      ++current_;
      if (argument->kind != NodeKind::kIdentifier) {
        return Error("expected a name before '=' in a keyword argument");
      }
      NodePtr keyword = Make(NodeKind::kKeywordArg, position);
      keyword->text = argument->text;
      CONNEX_ASSIGN_OR_RETURN(NodePtr value, ParseExpression());
      keyword->children.push_back(std::move(value));
      argument = std::move(keyword);
      saw_keyword = true;
    } else if (saw_keyword) {
      return Error("positional argument after a keyword argument");
    }
    call->children.push_back(std::move(argument));
    if (Is(TokenType::kComma)) ++current_;
  }
  ++current_;  // )
  CONNEX_ASSIGN_OR_RETURN(NodePtr member, ParseMember(std::move(call)));
  if (Is(TokenType::kOpenParen)) return ParseCall(std::move(member));
  return member;
}

Parser::Result Parser::ParseMember(NodePtr object) {
  while (Is(TokenType::kDot) || Is(TokenType::kOpenSquare)) {
    NodePtr node = Make(NodeKind::kMember, Here());
    node->computed = Is(TokenType::kOpenSquare);
    ++current_;
    NodePtr property;
    if (node->computed) {
      CONNEX_ASSIGN_OR_RETURN(property, ParseSubscript());
      CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseSquare, "']'"));
    } else {
      CONNEX_ASSIGN_OR_RETURN(property, ParsePrimary());
      if (property->kind != NodeKind::kIdentifier && property->kind != NodeKind::kInt) {
        return Error("expected a name or an integer after '.'");
      }
    }
    node->children.push_back(std::move(object));
    node->children.push_back(std::move(property));
    object = std::move(node);
  }
  return object;
}

Parser::Result Parser::ParseSubscript() {
  const Position position = Here();
  std::vector<NodePtr> parts;
  bool is_slice = false;
  while (!Is(TokenType::kCloseSquare)) {
    if (current_ >= tokens_.size()) return Error("expected ']'");
    if (Is(TokenType::kColon)) {
      parts.push_back(nullptr);
      ++current_;
      is_slice = true;
    } else {
      CONNEX_ASSIGN_OR_RETURN(NodePtr part, ParseExpression());
      parts.push_back(std::move(part));
      if (Is(TokenType::kColon)) {
        ++current_;
        is_slice = true;
      }
    }
  }
  if (parts.empty()) return Error("expected an index or a slice inside '[]'");
  if (!is_slice) return std::move(parts[0]);
  if (parts.size() > 3) return Error("a slice takes at most start:stop:step");
  NodePtr slice = Make(NodeKind::kSlice, position);
  parts.resize(3);
  slice->children = std::move(parts);
  return slice;
}

Parser::Result Parser::ParsePrimary() {
  if (current_ >= tokens_.size()) return Error("expected an expression");
  const Token& token = tokens_[current_++];
  switch (token.type) {
    case TokenType::kNumber: {
      if (token.value.find('.') != std::string::npos) {
        NodePtr node = Make(NodeKind::kFloat, token.position);
        node->float_value = std::strtod(token.value.c_str(), nullptr);
        return node;
      }
      NodePtr node = Make(NodeKind::kInt, token.position);
      node->int_value = std::strtoll(token.value.c_str(), nullptr, 10);
      return node;
    }
    case TokenType::kString: {
      NodePtr node = Make(NodeKind::kString, token.position);
      node->text = token.value;
      while (Is(TokenType::kString)) node->text += tokens_[current_++].value;  // 'a' 'b'
      return node;
    }
    case TokenType::kIdentifier: {
      NodePtr node = Make(NodeKind::kIdentifier, token.position);
      node->text = token.value;
      return node;
    }
    case TokenType::kOpenParen: {
      CONNEX_ASSIGN_OR_RETURN(NodePtr inner, ParseSequence(/*primary=*/false));
      CONNEX_RETURN_IF_ERROR(Expect(TokenType::kCloseParen, "')'"));
      return inner;
    }
    case TokenType::kOpenSquare: {
      NodePtr node = Make(NodeKind::kArray, token.position);
      while (!Is(TokenType::kCloseSquare)) {
        if (current_ >= tokens_.size()) return Error("expected ']' to close the list");
        CONNEX_ASSIGN_OR_RETURN(NodePtr item, ParseExpression());
        node->children.push_back(std::move(item));
        if (Is(TokenType::kComma)) ++current_;
      }
      ++current_;
      return node;
    }
    case TokenType::kOpenCurly: {
      NodePtr node = Make(NodeKind::kObject, token.position);
      while (!Is(TokenType::kCloseCurly)) {
        if (current_ >= tokens_.size()) return Error("expected '}' to close the dict");
        CONNEX_ASSIGN_OR_RETURN(NodePtr key, ParseExpression());
        CONNEX_RETURN_IF_ERROR(Expect(TokenType::kColon, "':' between a key and its value"));
        CONNEX_ASSIGN_OR_RETURN(NodePtr value, ParseExpression());
        node->children.push_back(std::move(key));
        node->children.push_back(std::move(value));
        if (Is(TokenType::kComma)) ++current_;
      }
      ++current_;
      return node;
    }
    default:
      --current_;
      return Error("expected an expression");
  }
}

}  // namespace

absl::StatusOr<std::vector<NodePtr>> Parse(const std::vector<Token>& tokens) {
  return Parser(tokens).Run();
}

}  // namespace connex::serving::jinja
