// The methods of strings and dicts (`s.strip()`, `d.items()`, …), as @huggingface/jinja binds them.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "connex/serving/jinja/builtins.h"
#include "connex/serving/jinja/text.h"

namespace connex::serving::jinja {
namespace {

bool IsAsciiWord(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

}  // namespace

std::string TitleCase(std::string_view text) {
  std::string out(text);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] >= 'a' && out[i] <= 'z' && (i == 0 || !IsAsciiWord(out[i - 1]))) {
      out[i] = static_cast<char>(out[i] - 'a' + 'A');
    }
  }
  return out;
}

std::string Capitalize(std::string_view text) {
  if (text.empty()) return std::string();
  return AsciiUpper(text.substr(0, 1)) + std::string(text.substr(1));
}

namespace {

absl::StatusOr<Value> StartsOrEndsWith(const std::string& self, const CallArgs& args, bool start,
                                       std::string_view name) {
  if (args.positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(name), "() takes a string or a tuple of strings"));
  }
  const auto test = [&](const std::string& s) {
    if (s.size() > self.size()) return false;
    return start ? self.compare(0, s.size(), s) == 0
                 : self.compare(self.size() - s.size(), s.size(), s) == 0;
  };
  const Value& pattern = args.positional[0];
  if (pattern.is_string()) return Value::Bool(test(pattern.str()));
  if (pattern.is_array()) {
    for (const Value& item : pattern.items()) {
      if (!item.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(std::string(name), "(): tuple elements must be strings"));
      }
      if (test(item.str())) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(name), "() takes a string or a tuple of strings, not ", pattern.TypeName()));
}

absl::StatusOr<Value> Split(const std::string& self, const CallArgs& args) {
  const Value sep = args.positional.empty() ? Value::Null() : args.positional[0];
  if (!sep.is_string() && !sep.is_null()) {
    return absl::InvalidArgumentError("split(): the separator must be a string or none");
  }
  int64_t maxsplit = -1;
  if (args.positional.size() > 1) {
    if (args.positional[1].kind() != Value::Kind::kInt) {
      return absl::InvalidArgumentError("split(): maxsplit must be an integer");
    }
    maxsplit = args.positional[1].int_value();
  }
  std::vector<Value> parts;
  if (sep.is_null()) {
    const std::string_view text = TrimJsStart(self);
    size_t pos = 0;
    while (pos < text.size()) {
      size_t word_end = pos;
      while (word_end < text.size()) {
        size_t next = word_end;
        if (IsJsWhitespace(NextCodePoint(text, &next))) break;
        word_end = next;
      }
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(Value::String(std::string(text.substr(pos))));
        break;
      }
      parts.push_back(Value::String(std::string(text.substr(pos, word_end - pos))));
      pos = word_end;
      while (pos < text.size()) {
        size_t next = pos;
        if (!IsJsWhitespace(NextCodePoint(text, &next))) break;
        pos = next;
      }
    }
    return Value::Array(std::move(parts));
  }
  const std::string& separator = sep.str();
  if (separator.empty()) return absl::InvalidArgumentError("split(): empty separator");
  std::vector<std::string> pieces;
  size_t start = 0;
  while (true) {
    const size_t found = self.find(separator, start);
    if (found == std::string::npos) break;
    pieces.push_back(self.substr(start, found - start));
    start = found + separator.size();
  }
  pieces.push_back(self.substr(start));
  if (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) > maxsplit) {
    std::string rest;
    for (size_t i = maxsplit; i < pieces.size(); ++i) {
      if (i > static_cast<size_t>(maxsplit)) rest += separator;
      rest += pieces[i];
    }
    pieces.resize(maxsplit);
    pieces.push_back(std::move(rest));
  }
  for (std::string& piece : pieces) parts.push_back(Value::String(std::move(piece)));
  return Value::Array(std::move(parts));
}

}  // namespace

absl::StatusOr<Value> ReplaceMethod(const std::string& self, const CallArgs& args) {
  if (args.positional.size() < 2) {
    return absl::InvalidArgumentError("replace() takes the old and the new string");
  }
  const Value& old_value = args.positional[0];
  const Value& new_value = args.positional[1];
  if (!old_value.is_string() || !new_value.is_string()) {
    return absl::InvalidArgumentError("replace(): the old and the new value must be strings");
  }
  Value count = Value::Null();
  if (args.positional.size() > 2) {
    count = args.positional[2];
  } else if (const Value* keyword = args.Keyword("count")) {
    count = *keyword;
  }
  if (count.kind() != Value::Kind::kInt && !count.is_null()) {
    return absl::InvalidArgumentError("replace(): count must be an integer or none");
  }
  int64_t remaining = count.is_null() || count.int_value() < 0 ? std::numeric_limits<int64_t>::max()
                                                               : count.int_value();
  const std::string& from = old_value.str();
  const std::string& to = new_value.str();
  std::string out;
  if (from.empty()) {  // before every code point and at the end
    for (std::string_view cp : SplitCodePoints(self)) {
      if (remaining > 0) {
        out += to;
        --remaining;
      }
      out += cp;
    }
    if (remaining > 0) out += to;
    return Value::String(std::move(out));
  }
  size_t start = 0;
  while (remaining > 0) {
    const size_t found = self.find(from, start);
    if (found == std::string::npos) break;
    out.append(self, start, found - start);
    out += to;
    start = found + from.size();
    --remaining;
  }
  out.append(self, start, std::string::npos);
  return Value::String(std::move(out));
}

Value MemberBuiltin(const Value& object, std::string_view name) {
  if (object.is_string()) {
    const std::string self = object.str();
    if (name == "length") return Value::Int(static_cast<int64_t>(Utf16Length(self)));
    if (name == "upper") {
      return Value::Callable([self](const CallArgs&) { return Value::String(AsciiUpper(self)); });
    }
    if (name == "lower") {
      return Value::Callable([self](const CallArgs&) { return Value::String(AsciiLower(self)); });
    }
    // The reference ignores any argument of strip/lstrip/rstrip: they remove whitespace.
    if (name == "strip") {
      return Value::Callable(
          [self](const CallArgs&) { return Value::String(std::string(TrimJs(self))); });
    }
    if (name == "lstrip") {
      return Value::Callable(
          [self](const CallArgs&) { return Value::String(std::string(TrimJsStart(self))); });
    }
    if (name == "rstrip") {
      return Value::Callable(
          [self](const CallArgs&) { return Value::String(std::string(TrimJsEnd(self))); });
    }
    if (name == "title") {
      return Value::Callable([self](const CallArgs&) { return Value::String(TitleCase(self)); });
    }
    if (name == "capitalize") {
      return Value::Callable([self](const CallArgs&) { return Value::String(Capitalize(self)); });
    }
    if (name == "startswith" || name == "endswith") {
      const bool start = name == "startswith";
      return Value::Callable([self, start](const CallArgs& args) {
        return StartsOrEndsWith(self, args, start, start ? "startswith" : "endswith");
      });
    }
    if (name == "split") {
      return Value::Callable([self](const CallArgs& args) { return Split(self, args); });
    }
    if (name == "replace") {
      return Value::Callable([self](const CallArgs& args) { return ReplaceMethod(self, args); });
    }
    return Value();
  }
  if (object.is_array()) {
    if (name == "length") return Value::Int(static_cast<int64_t>(object.items().size()));
    return Value();
  }
  if (object.is_object()) {
    if (name == "get") {
      return Value::Callable([object](const CallArgs& args) -> absl::StatusOr<Value> {
        if (args.positional.empty() || !args.positional[0].is_string()) {
          return absl::InvalidArgumentError("get(): the key must be a string");
        }
        if (const Value* found = object.members().Find(args.positional[0].str())) return *found;
        return args.positional.size() > 1 ? args.positional[1] : Value::Null();
      });
    }
    if (name == "items" || name == "keys" || name == "values") {
      const std::string which(name);
      return Value::Callable([object, which](const CallArgs&) {
        std::vector<Value> out;
        for (const auto& [key, value] : object.members().entries()) {
          if (which == "items") {
            out.push_back(Value::Array({Value::String(key), value}));
          } else {
            out.push_back(which == "keys" ? Value::String(key) : value);
          }
        }
        return Value::Array(std::move(out));
      });
    }
  }
  return Value();
}

}  // namespace connex::serving::jinja
