#include "connex/serving/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "connex/serving/jinja/text.h"

namespace connex::serving::jinja {

const Value* CallArgs::Keyword(std::string_view name) const {
  for (const auto& [key, value] : keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

const Value* Members::Find(std::string_view key) const {
  for (const auto& entry : entries_) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

void Members::Set(std::string key, Value value) {
  for (auto& entry : entries_) {
    if (entry.first == key) {
      entry.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

Value Value::Null() {
  Value v;
  v.kind_ = Kind::kNull;
  return v;
}

Value Value::Bool(bool value) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = value;
  return v;
}

Value Value::Int(int64_t value) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = value;
  return v;
}

Value Value::Float(double value) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = value;
  return v;
}

Value Value::Number(double value) {
  if (std::isfinite(value) && value == std::trunc(value) && value >= -9223372036854775808.0 &&
      value < 9223372036854775808.0) {
    return Int(static_cast<int64_t>(value));
  }
  return Float(value);
}

Value Value::String(std::string value) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::make_shared<const std::string>(std::move(value));
  return v;
}

Value Value::Array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kArray;
  v.array_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}

Value Value::Object() { return Object(Members()); }

Value Value::Object(Members members) {
  Value v;
  v.kind_ = Kind::kObject;
  v.members_ = std::make_shared<Members>(std::move(members));
  return v;
}

Value Value::Namespace(Members members) {
  Value v = Object(std::move(members));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::Callable(Function function) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.function_ = std::make_shared<const Function>(std::move(function));
  return v;
}

namespace {

// The key as a JavaScript array index: a canonical decimal below 2^32 - 1.
std::optional<uint32_t> ArrayIndex(const std::string& key) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key[0] == '0')) return std::nullopt;
  uint64_t value = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value >= 4294967295u) return std::nullopt;
  return static_cast<uint32_t>(value);
}

}  // namespace

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return Null();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: {
      const double d = json.get<double>();
      if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9007199254740992.0) {
        return Int(static_cast<int64_t>(d));
      }
      return Float(d);
    }
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return Array(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      // A JavaScript object lists its array-index keys ("0", "17", …) first, in numeric order,
      // then the others as inserted; the reference's dicts come from such objects.
      std::vector<std::pair<uint32_t, const std::string*>> indices;
      for (const auto& [key, item] : json.items()) {
        if (auto index = ArrayIndex(key)) indices.emplace_back(*index, &key);
      }
      std::sort(indices.begin(), indices.end());
      Members members;
      for (const auto& [index, key] : indices) members.Set(*key, FromJson(json.at(*key)));
      for (const auto& [key, item] : json.items()) {
        if (!ArrayIndex(key)) members.Set(key, FromJson(item));
      }
      return Object(std::move(members));
    }
    case nlohmann::ordered_json::value_t::binary:
      break;
  }
  return Null();
}

double Value::number() const {
  switch (kind_) {
    case Kind::kInt:
      return static_cast<double>(int_);
    case Kind::kFloat:
      return float_;
    case Kind::kBool:
      return bool_ ? 1 : 0;
    default:
      return 0;
  }
}

const void* Value::identity() const {
  if (array_) return array_.get();
  if (members_) return members_.get();
  if (function_) return function_.get();
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNull:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0 && !std::isnan(float_);
    case Kind::kString:
      return !string_->empty();
    case Kind::kArray:
      return !array_->empty();
    case Kind::kObject:
      return members_->size() > 0;
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNull:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "array";
    case Kind::kObject:
      return "object";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

namespace {

// JavaScript's JSON.stringify of a number.
std::string JsonNumber(const Value& value) {
  if (value.kind() == Value::Kind::kInt) return std::to_string(value.int_value());
  const double d = value.float_value();
  if (!std::isfinite(d)) return "null";
  return JsNumberToString(d);
}

// FloatValue.toString: integral floats keep ".0".
std::string FloatOutput(double d) {
  if (d == 0 && std::signbit(d)) return "-0.0";
  if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 1e21) {
    return JsNumberToString(d) + ".0";
  }
  return JsNumberToString(d);
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& value, const JsonStyle& style, int depth) {
  std::string item_separator = style.indent > 0 ? "," : ", ";
  std::string key_separator = ": ";
  if (style.separators) {
    item_separator = style.separators->first;
    key_separator = style.separators->second;
  }
  switch (value.kind()) {
    case Value::Kind::kNull:
      return std::string("null");
    case Value::Kind::kUndefined:
      return std::string(style.undefined_as_null ? "null" : "undefined");
    case Value::Kind::kBool:
      return std::string(value.bool_value() ? "true" : "false");
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
      return JsonNumber(value);
    case Value::Kind::kString:
      return JsonQuote(value.str(), style.ensure_ascii);
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError("tojson: a function cannot be converted to JSON");
    case Value::Kind::kArray:
    case Value::Kind::kObject:
    case Value::Kind::kNamespace:
      break;
  }
  const std::string indent(style.indent > 0 ? style.indent : 0, ' ');
  std::string base_padding = "\n";
  for (int i = 0; i < depth; ++i) base_padding += indent;
  const std::string child_padding = base_padding + indent;
  std::vector<std::string> parts;
  if (value.is_array()) {
    for (const Value& item : value.items()) {
      auto text = ToJson(item, style, depth + 1);
      if (!text.ok()) return text.status();
      parts.push_back(*std::move(text));
    }
    if (style.indent > 0 && !parts.empty()) {
      std::string out = "[" + child_padding;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) out += item_separator + child_padding;
        out += parts[i];
      }
      return out + base_padding + "]";
    }
    std::string out = "[";
    for (size_t i = 0; i < parts.size(); ++i) out += (i > 0 ? item_separator : "") + parts[i];
    return out + "]";
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (const auto& entry : value.members().entries()) entries.push_back(&entry);
  if (style.sort_keys) {
    std::stable_sort(entries.begin(), entries.end(),
                     [](const auto* a, const auto* b) { return a->first < b->first; });
  }
  for (const auto* entry : entries) {
    auto text = ToJson(entry->second, style, depth + 1);
    if (!text.ok()) return text.status();
    std::string part = JsonQuote(entry->first, style.ensure_ascii) + key_separator + *text;
    parts.push_back(style.indent > 0 ? child_padding + part : part);
  }
  std::string out = "{";
  for (size_t i = 0; i < parts.size(); ++i) out += (i > 0 ? item_separator : "") + parts[i];
  if (style.indent > 0 && !parts.empty()) out += base_padding;
  return out + "}";
}

absl::StatusOr<std::string> ToOutput(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNull:
      return std::string();
    case Value::Kind::kBool:
      return std::string(value.bool_value() ? "true" : "false");
    case Value::Kind::kInt:
      return std::to_string(value.int_value());
    case Value::Kind::kFloat:
      return FloatOutput(value.float_value());
    case Value::Kind::kString:
      return value.str();
    case Value::Kind::kArray:
    case Value::Kind::kObject:
    case Value::Kind::kNamespace:
      return ToJson(value, OutputStyle());
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError("cannot print a function");
  }
  return std::string();
}

absl::StatusOr<std::string> ToStringForConcat(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kFloat:
      return JsNumberToString(value.float_value());
    case Value::Kind::kUndefined:
    case Value::Kind::kNull:
      return std::string("undefined");
    case Value::Kind::kArray: {
      std::string out;
      for (size_t i = 0; i < value.items().size(); ++i) {
        if (i > 0) out += ",";
        const Value& item = value.items()[i];
        if (item.is_undefined() || item.is_null()) {
          out += "undefined";
          continue;
        }
        auto text = ToOutput(item);
        if (!text.ok()) return text.status();
        out += *text;
      }
      return out;
    }
    case Value::Kind::kObject:
    case Value::Kind::kNamespace:
      return std::string("[object Map]");
    default:
      return ToOutput(value);
  }
}

namespace {

bool IsNullish(const Value& v) { return v.is_undefined() || v.is_null(); }

// JavaScript's ToNumber of a string, for loose equality.
double StringToNumber(std::string_view text) {
  const std::string trimmed(TrimJs(text));
  if (trimmed.empty()) return 0;
  char* end = nullptr;
  const double d = std::strtod(trimmed.c_str(), &end);
  if (end != trimmed.c_str() + trimmed.size()) return std::nan("");
  return d;
}

}  // namespace

bool LooseEquals(const Value& a, const Value& b) {
  if (IsNullish(a) || IsNullish(b)) return IsNullish(a) && IsNullish(b);
  using K = Value::Kind;
  const bool a_num = a.is_number() || a.kind() == K::kBool;
  const bool b_num = b.is_number() || b.kind() == K::kBool;
  if (a_num && b_num) return a.number() == b.number();
  if (a.is_string() && b.is_string()) return a.str() == b.str();
  if (a.is_string() && b_num) return StringToNumber(a.str()) == b.number();
  if (a_num && b.is_string()) return a.number() == StringToNumber(b.str());
  if (a.identity() != nullptr && b.identity() != nullptr) return a.identity() == b.identity();
  return false;
}

bool StrictEquals(const Value& a, const Value& b) {
  if (IsNullish(a) || IsNullish(b)) return IsNullish(a) && IsNullish(b);
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kBool:
      return a.bool_value() == b.bool_value();
    case Value::Kind::kString:
      return a.str() == b.str();
    default:
      return a.identity() == b.identity();
  }
}

}  // namespace connex::serving::jinja
