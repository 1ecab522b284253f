#include "connex/serving/jinja/builtins.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "connex/serving/jinja/text.h"

namespace connex::serving::jinja {
namespace {

absl::Status FilterError(std::string_view name, const Value& operand) {
  return absl::InvalidArgumentError(absl::StrCat(
      "filter '", std::string(name), "' is not supported on a ", operand.TypeName(), " value"));
}

// JavaScript's parseInt(text, 10) / parseFloat(text); nullopt for NaN.
std::optional<double> ParseJsNumber(std::string_view text, bool integer) {
  const std::string s(TrimJsStart(text));
  const char* begin = s.c_str();
  char* end = nullptr;
  const double d =
      integer ? static_cast<double>(std::strtoll(begin, &end, 10)) : std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return d;
}

// Array.prototype.join over the items' JavaScript values.
absl::StatusOr<std::string> JoinItems(const std::vector<Value>& items, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    if (items[i].is_null() || items[i].is_undefined()) continue;
    auto text = ToStringForConcat(items[i]);
    if (!text.ok()) return text.status();
    out += *text;
  }
  return out;
}

absl::StatusOr<Value> ToJsonFilter(const Value& operand, const CallArgs* args) {
  JsonStyle style;
  if (args != nullptr) {
    if (const Value* indent = args->Keyword("indent"); indent && !indent->is_null()) {
      if (indent->kind() != Value::Kind::kInt) {
        return absl::InvalidArgumentError("tojson: indent must be an integer");
      }
      style.indent = static_cast<int>(indent->int_value());
    }
    if (const Value* ascii = args->Keyword("ensure_ascii")) {
      if (ascii->kind() != Value::Kind::kBool) {
        return absl::InvalidArgumentError("tojson: ensure_ascii must be a boolean");
      }
      style.ensure_ascii = ascii->bool_value();
    }
    if (const Value* sort = args->Keyword("sort_keys")) {
      if (sort->kind() != Value::Kind::kBool) {
        return absl::InvalidArgumentError("tojson: sort_keys must be a boolean");
      }
      style.sort_keys = sort->bool_value();
    }
    if (const Value* separators = args->Keyword("separators");
        separators && !separators->is_null()) {
      if (!separators->is_array() || separators->items().size() != 2 ||
          !separators->items()[0].is_string() || !separators->items()[1].is_string()) {
        return absl::InvalidArgumentError("tojson: separators must be a tuple of two strings");
      }
      style.separators = std::make_pair(separators->items()[0].str(), separators->items()[1].str());
    }
  }
  auto text = ToJson(operand, style);
  if (!text.ok()) return text.status();
  return Value::String(*std::move(text));
}

absl::StatusOr<Value> Indent(const std::string& text, const CallArgs* args) {
  std::string indent = "    ";
  bool first = false;
  bool blank = false;
  if (args != nullptr) {
    const Value* width = !args->positional.empty() ? &args->positional[0] : args->Keyword("width");
    if (width != nullptr) {
      if (width->is_string()) {
        indent = width->str();
      } else if (width->kind() == Value::Kind::kInt) {
        indent = std::string(std::max<int64_t>(0, width->int_value()), ' ');
      } else {
        return absl::InvalidArgumentError("indent: width must be an integer or a string");
      }
    }
    const Value* f = args->positional.size() > 1 ? &args->positional[1] : args->Keyword("first");
    const Value* b = args->positional.size() > 2 ? &args->positional[2] : args->Keyword("blank");
    first = f != nullptr && f->Truthy();
    blank = b != nullptr && b->Truthy();
  }
  std::string out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    const size_t end = text.find('\n', start);
    const std::string_view piece = std::string_view(text).substr(
        start, end == std::string::npos ? std::string::npos : end - start);
    if (line > 0) out += "\n";
    if (!((!first && line == 0) || (!blank && piece.empty()))) out += indent;
    out += piece;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> NumberFilter(std::string_view name, const Value& operand,
                                   const CallArgs* args) {
  const bool integer = name == "int";
  Value fallback = integer ? Value::Int(0) : Value::Float(0);
  if (args != nullptr) {
    if (!args->positional.empty()) {
      fallback = args->positional[0];
    } else if (const Value* d = args->Keyword("default")) {
      fallback = *d;
    }
  }
  const auto make = [integer](double d) {
    return integer ? Value::Number(std::trunc(d)) : Value::Float(d);
  };
  switch (operand.kind()) {
    case Value::Kind::kString: {
      auto parsed = ParseJsNumber(operand.str(), integer);
      return parsed ? make(*parsed) : fallback;
    }
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
    case Value::Kind::kBool:
      return make(operand.number());
    default:
      return FilterError(name, operand);
  }
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& operand,
                                  const CallArgs* args) {
  // Filters that take the same arguments on every type.
  if (name == "safe" && args == nullptr) return operand;
  if (name == "tojson") return ToJsonFilter(operand, args);
  if (name == "int" || name == "float") {
    if (args != nullptr || operand.is_string() || operand.is_number() ||
        operand.kind() == Value::Kind::kBool) {
      return NumberFilter(name, operand, args);
    }
  }
  if (name == "default" && args != nullptr) {
    const Value fallback = args->positional.empty() ? Value::String("") : args->positional[0];
    const Value* boolean =
        args->positional.size() > 1 ? &args->positional[1] : args->Keyword("boolean");
    if (boolean != nullptr && boolean->kind() != Value::Kind::kBool) {
      return absl::InvalidArgumentError("default: the boolean flag must be a boolean");
    }
    const bool use_falsy = boolean != nullptr && boolean->bool_value();
    if (operand.is_undefined() || (use_falsy && !operand.Truthy())) return fallback;
    return operand;
  }
  if (name == "join" && args != nullptr) {
    const Value* sep =
        !args->positional.empty() ? &args->positional[0] : args->Keyword("separator");
    if (sep != nullptr && !sep->is_string()) {
      return absl::InvalidArgumentError("join: the separator must be a string");
    }
    const std::string separator = sep ? sep->str() : "";
    if (operand.is_string()) {
      std::string out;
      const auto points = SplitCodePoints(operand.str());
      for (size_t i = 0; i < points.size(); ++i)
        out += (i > 0 ? separator : "") + std::string(points[i]);
      return Value::String(std::move(out));
    }
    if (operand.is_array()) {
      auto text = JoinItems(operand.items(), separator);
      if (!text.ok()) return text.status();
      return Value::String(*std::move(text));
    }
    return FilterError(name, operand);
  }
  if (operand.is_array() && args == nullptr) {
    const std::vector<Value>& items = operand.items();
    if (name == "list") return operand;
    if (name == "first") return items.empty() ? Value() : items.front();
    if (name == "last") return items.empty() ? Value() : items.back();
    if (name == "length") return Value::Int(static_cast<int64_t>(items.size()));
    if (name == "reverse") return Value::Array(std::vector<Value>(items.rbegin(), items.rend()));
    if (name == "join") {
      auto text = JoinItems(items, "");
      if (!text.ok()) return text.status();
      return Value::String(*std::move(text));
    }
    if (name == "string") {
      auto text = ToJson(operand, OutputStyle());
      if (!text.ok()) return text.status();
      return Value::String(*std::move(text));
    }
  } else if (operand.is_string()) {
    const std::string& s = operand.str();
    if (args == nullptr) {
      if (name == "length") return Value::Int(static_cast<int64_t>(Utf16Length(s)));
      if (name == "upper") return Value::String(AsciiUpper(s));
      if (name == "lower") return Value::String(AsciiLower(s));
      if (name == "title") return Value::String(TitleCase(s));
      if (name == "capitalize") return Value::String(Capitalize(s));
      if (name == "trim") return Value::String(std::string(TrimJs(s)));
      if (name == "join" || name == "string") return operand;
    }
    if (name == "indent") return Indent(s, args);
    if (name == "replace" && args != nullptr) return ReplaceMethod(s, *args);
  } else if (operand.is_number() && args == nullptr) {
    if (name == "abs") {
      return operand.kind() == Value::Kind::kInt ? Value::Number(std::fabs(operand.number()))
                                                 : Value::Float(std::fabs(operand.float_value()));
    }
    if (name == "string") {
      auto text = ToOutput(operand);
      if (!text.ok()) return text.status();
      return Value::String(*std::move(text));
    }
  } else if (operand.is_object()) {
    if (args == nullptr && name == "length") {
      return Value::Int(static_cast<int64_t>(operand.members().size()));
    }
    if (name == "items" || name == "keys" || name == "values" || name == "get") {
      Value method = MemberBuiltin(operand, name);
      return method.function()(args != nullptr ? *args : CallArgs{});
    }
  } else if (operand.kind() == Value::Kind::kBool && args == nullptr) {
    if (name == "bool") return operand;
    if (name == "string") return Value::String(operand.bool_value() ? "true" : "false");
  }
  return FilterError(name, operand);
}

absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& operand) {
  using K = Value::Kind;
  const K kind = operand.kind();
  if (name == "defined") return kind != K::kUndefined;
  if (name == "undefined") return kind == K::kUndefined;
  if (name == "none") return kind == K::kNull;
  if (name == "boolean") return kind == K::kBool;
  if (name == "true") return kind == K::kBool && operand.bool_value();
  if (name == "false") return kind == K::kBool && !operand.bool_value();
  if (name == "string") return kind == K::kString;
  if (name == "number") return operand.is_number();
  if (name == "integer") return kind == K::kInt;
  if (name == "iterable") return kind == K::kArray || kind == K::kString;
  if (name == "mapping") return kind == K::kObject;
  if (name == "sequence") return kind == K::kArray || kind == K::kObject || kind == K::kString;
  if (name == "callable") return kind == K::kFunction;
  if (name == "lower") return kind == K::kString && operand.str() == AsciiLower(operand.str());
  if (name == "upper") return kind == K::kString && operand.str() == AsciiUpper(operand.str());
  if (name == "odd" || name == "even") {
    if (kind != K::kInt) {
      return absl::InvalidArgumentError(absl::StrCat(
          "test '", std::string(name), "' needs an integer, not ", operand.TypeName()));
    }
    return (operand.int_value() % 2 != 0) == (name == "odd");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("test '", std::string(name), "' is not supported"));
}

std::string FormatTime(const std::tm& time, std::string_view format) {
  static constexpr const char* kMonths[] = {"January",   "February", "March",    "April",
                                            "May",       "June",     "July",     "August",
                                            "September", "October",  "November", "December"};
  const auto pad2 = [](int n) { return n < 10 ? absl::StrCat("0", n) : absl::StrCat(n); };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    const char d = format[i + 1];
    const std::string month = kMonths[time.tm_mon % 12];
    switch (d) {
      case 'Y':
        out += std::to_string(time.tm_year + 1900);
        break;
      case 'm':
        out += pad2(time.tm_mon + 1);
        break;
      case 'd':
        out += pad2(time.tm_mday);
        break;
      case 'b':
        out += month.substr(0, 3);
        break;
      case 'B':
        out += month;
        break;
      case 'H':
        out += pad2(time.tm_hour);
        break;
      case 'M':
        out += pad2(time.tm_min);
        break;
      case '%':
        out += "%";
        break;
      default:
        out.push_back('%');
        out.push_back(d);
        break;
    }
    ++i;
  }
  return out;
}

Members GlobalNames(std::function<std::tm()> local_time) {
  Members globals;
  globals.Set("true", Value::Bool(true));
  globals.Set("false", Value::Bool(false));
  globals.Set("none", Value::Null());
  globals.Set("True", Value::Bool(true));
  globals.Set("False", Value::Bool(false));
  globals.Set("None", Value::Null());
  globals.Set(
      "namespace", Value::Callable([](const CallArgs& args) -> absl::StatusOr<Value> {
        Members members;
        if (args.positional.size() > 1) {
          return absl::InvalidArgumentError("namespace() takes at most one positional argument");
        }
        if (args.positional.size() == 1) {
          if (!args.positional[0].is_object()) {
            return absl::InvalidArgumentError("namespace() takes a dict");
          }
          for (const auto& [k, v] : args.positional[0].members().entries()) members.Set(k, v);
        }
        for (const auto& [k, v] : args.keyword) members.Set(k, v);
        return Value::Namespace(std::move(members));
      }));
  globals.Set("raise_exception", Value::Callable([](const CallArgs& args) -> absl::StatusOr<Value> {
                std::string message;
                if (!args.positional.empty()) {
                  auto text = ToStringForConcat(args.positional[0]);
                  if (text.ok()) message = *text;
                }
                return absl::InvalidArgumentError(absl::StrCat("raise_exception: ", message));
              }));
  globals.Set("range", Value::Callable([](const CallArgs& args) -> absl::StatusOr<Value> {
                for (const Value& a : args.positional) {
                  if (a.kind() != Value::Kind::kInt) {
                    return absl::InvalidArgumentError("range() takes integers");
                  }
                }
                if (args.positional.empty() || args.positional.size() > 3) {
                  return absl::InvalidArgumentError("range() takes 1 to 3 integers");
                }
                int64_t start = 0, stop = 0, step = 1;
                if (args.positional.size() == 1) {
                  stop = args.positional[0].int_value();
                } else {
                  start = args.positional[0].int_value();
                  stop = args.positional[1].int_value();
                  if (args.positional.size() == 3) step = args.positional[2].int_value();
                }
                if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
                // A bound on what a template can make us allocate (not in the reference).
                constexpr int64_t kMaxItems = int64_t{1} << 20;
                if ((stop - start) / step > kMaxItems) {
                  return absl::InvalidArgumentError(
                      absl::StrCat("range() of more than ", kMaxItems, " items"));
                }
                std::vector<Value> out;
                for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                  out.push_back(Value::Int(i));
                }
                return Value::Array(std::move(out));
              }));
  globals.Set("strftime_now",
              Value::Callable([local_time](const CallArgs& args) -> absl::StatusOr<Value> {
                if (args.positional.empty() || !args.positional[0].is_string()) {
                  return absl::InvalidArgumentError("strftime_now() takes a format string");
                }
                return Value::String(FormatTime(local_time(), args.positional[0].str()));
              }));
  return globals;
}

}  // namespace connex::serving::jinja
