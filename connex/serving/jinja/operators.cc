// The binary operators, with the reference's rules: `==` is JavaScript's loose equality, `+` adds
// numbers, concatenates strings (converting the other side) and lists, `~` concatenates anything
// but none, `in` looks into lists, strings and dicts, `<`/`>` compare numbers only.
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "connex/serving/jinja/builtins.h"

namespace connex::serving::jinja {
namespace {

bool IsNumeric(const Value& v) { return v.is_number(); }
bool IsNumericLike(const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; }

absl::StatusOr<Value> Arithmetic(std::string_view op, const Value& left, const Value& right) {
  const bool both_int = left.kind() == Value::Kind::kInt && right.kind() == Value::Kind::kInt;
  const double a = left.number();
  const double b = right.number();
  if (op == "<") return Value::Bool(a < b);
  if (op == ">") return Value::Bool(a > b);
  if (op == "<=") return Value::Bool(a <= b);
  if (op == ">=") return Value::Bool(a >= b);
  if (op == "/") return Value::Float(a / b);
  if (both_int) {
    const int64_t x = left.int_value();
    const int64_t y = right.int_value();
    int64_t result = 0;
    if (op == "+")
      return __builtin_add_overflow(x, y, &result) ? Value::Float(a + b) : Value::Int(result);
    if (op == "-")
      return __builtin_sub_overflow(x, y, &result) ? Value::Float(a - b) : Value::Int(result);
    if (op == "*")
      return __builtin_mul_overflow(x, y, &result) ? Value::Float(a * b) : Value::Int(result);
    if (y == 0 && (op == "//" || op == "%")) return Value::Float(std::nan(""));
    if (op == "//") return Value::Number(std::floor(a / b));
    if (op == "%") return Value::Int(y == -1 ? 0 : x % y);
  } else {
    if (op == "+") return Value::Float(a + b);
    if (op == "-") return Value::Float(a - b);
    if (op == "*") return Value::Float(a * b);
    if (op == "//") return Value::Float(std::floor(a / b));
    if (op == "%") return Value::Float(std::fmod(a, b));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("operator '", std::string(op), "' is not supported on numbers"));
}

absl::StatusOr<std::string> Concat(const Value& left, const Value& right) {
  auto a = ToStringForConcat(left);
  if (!a.ok()) return a.status();
  auto b = ToStringForConcat(right);
  if (!b.ok()) return b.status();
  return *a + *b;
}

}  // namespace

absl::StatusOr<Value> BinaryOperation(std::string_view op, const Value& left, const Value& right) {
  if (op == "==") return Value::Bool(LooseEquals(left, right));
  if (op == "!=") return Value::Bool(!LooseEquals(left, right));
  if (IsNumeric(left) && IsNumeric(right) && op != "~" && op != "**") {
    if (op != "in" && op != "not in") return Arithmetic(op, left, right);
  } else if (left.is_undefined() || right.is_undefined()) {
    if (right.is_undefined() && (op == "in" || op == "not in")) return Value::Bool(op == "not in");
    if (op == "~" && !left.is_null() && !right.is_null()) {
      auto a = left.is_undefined() ? absl::StatusOr<std::string>("") : ToStringForConcat(left);
      auto b = right.is_undefined() ? absl::StatusOr<std::string>("") : ToStringForConcat(right);
      if (!a.ok()) return a.status();
      if (!b.ok()) return b.status();
      return Value::String(*a + *b);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("operator '", std::string(op), "' on an undefined value (", left.TypeName(),
                     " ", std::string(op), " ", right.TypeName(), ")"));
  } else if (left.is_null() || right.is_null()) {
    return absl::InvalidArgumentError(absl::StrCat("operator '", std::string(op), "' on none (",
                                                   left.TypeName(), " ", std::string(op), " ",
                                                   right.TypeName(), ")"));
  } else if (op == "~") {
    auto text = Concat(left, right);
    if (!text.ok()) return text.status();
    return Value::String(*std::move(text));
  } else if (op == "**" && IsNumericLike(left) && IsNumericLike(right)) {
    const double a = left.number();
    const double b = right.number();
    if (a == 0 && b < 0)
      return absl::InvalidArgumentError("0 cannot be raised to a negative power");
    const double result = std::pow(a, b);
    if (!std::isfinite(result)) return absl::InvalidArgumentError("'**' overflowed");
    if (left.kind() == Value::Kind::kFloat || right.kind() == Value::Kind::kFloat || b < 0) {
      return Value::Float(result);
    }
    return Value::Number(result);
  } else if (left.is_array() && right.is_array()) {
    if (op == "+") {
      std::vector<Value> items = left.items();
      items.insert(items.end(), right.items().begin(), right.items().end());
      return Value::Array(std::move(items));
    }
  } else if (right.is_array()) {
    if (op == "in" || op == "not in") {
      bool member = false;
      for (const Value& item : right.items()) member = member || StrictEquals(item, left);
      return Value::Bool(member == (op == "in"));
    }
  }
  if ((left.is_string() || right.is_string()) && op == "+") {
    auto text = Concat(left, right);
    if (!text.ok()) return text.status();
    return Value::String(*std::move(text));
  }
  if (left.is_string() && right.is_string() && (op == "in" || op == "not in")) {
    return Value::Bool((right.str().find(left.str()) != std::string::npos) == (op == "in"));
  }
  if (left.is_string() && right.is_object() && (op == "in" || op == "not in")) {
    return Value::Bool((right.members().Find(left.str()) != nullptr) == (op == "in"));
  }
  return absl::InvalidArgumentError(absl::StrCat("operator '", std::string(op),
                                                 "' is not supported between ", left.TypeName(),
                                                 " and ", right.TypeName()));
}

}  // namespace connex::serving::jinja
