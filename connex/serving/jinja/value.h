// The values a Jinja template computes with, modelled on @huggingface/jinja's runtime values (the
// reference implementation of Hugging Face chat templates): undefined, none, booleans, integers,
// floats, strings, arrays, ordered objects, namespaces and functions. Arrays, objects and
// namespaces are shared by reference, as in JavaScript (`set ns.x = …` is seen through every
// copy). Thread-compatible: a Value is not synchronised; one render owns the values it makes.
#ifndef CONNEX_SERVING_JINJA_VALUE_H_
#define CONNEX_SERVING_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace connex::serving::jinja {

class Value;
class Members;
struct CallArgs;

// A callable value (raise_exception, namespace, a bound string method, …).
using Function = std::function<absl::StatusOr<Value>(const CallArgs& args)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNull,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kNamespace,
    kFunction
  };

  Value() = default;  // undefined
  static Value Null();
  static Value Bool(bool value);
  static Value Int(int64_t value);
  static Value Float(double value);
  // An integer when `value` is an integer int64 can hold, else a float (JavaScript's numbers are
  // doubles: arithmetic past int64 goes on in floating point rather than overflowing).
  static Value Number(double value);
  static Value String(std::string value);
  static Value Array(std::vector<Value> items);
  static Value Object();
  static Value Object(Members members);
  static Value Namespace(Members members);
  static Value Callable(Function function);

  // JSON null/bool/number/string/array/object become none/bool/int or float/string/array/object
  // (a float with an integral value becomes an integer, as JavaScript's numbers cannot tell them
  // apart); object keys keep their order.
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }

  bool bool_value() const { return bool_; }
  int64_t int_value() const { return int_; }
  double float_value() const { return float_; }
  // The number as a double (ints and floats; booleans as 0/1).
  double number() const;
  const std::string& str() const { return *string_; }
  const std::vector<Value>& items() const { return *array_; }
  // Objects and namespaces.
  Members& members() const { return *members_; }
  const Function& function() const { return *function_; }

  // Identity of arrays, objects and namespaces (JavaScript's reference equality).
  const void* identity() const;

  // Python truthiness as the reference computes it: empty strings, arrays and objects, zero,
  // none and undefined are false; a namespace or a function is true.
  bool Truthy() const;
  // The type's name in error messages ("string", "array", "undefined", …).
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const std::vector<Value>> array_;
  std::shared_ptr<Members> members_;
  std::shared_ptr<const Function> function_;
};

// The arguments of a call: positional ones, then keyword ones in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* Keyword(std::string_view name) const;
};

// Insertion-ordered string-keyed members (a JavaScript Map).
class Members {
 public:
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
};

// How `tojson` and the rendering of arrays and objects spell JSON.
struct JsonStyle {
  int indent = 0;  // 0: on one line
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;  // item, key
  bool undefined_as_null = true;  // false: "undefined", as rendering an array does
};

// The style of printing an array or a dict with `{{ }}` or `|string`.
inline JsonStyle OutputStyle() {
  JsonStyle style;
  style.undefined_as_null = false;
  return style;
}

// JSON text of `value` (the reference's toJSON). InvalidArgument for a function.
absl::StatusOr<std::string> ToJson(const Value& value, const JsonStyle& style, int depth = 0);

// What `{{ value }}` prints (undefined and none print nothing; booleans "true"/"false").
absl::StatusOr<std::string> ToOutput(const Value& value);
// The string conversion of `+` and `~` (JavaScript's toString of the value).
absl::StatusOr<std::string> ToStringForConcat(const Value& value);

// JavaScript's loose `==` on the two values, as the reference compares.
bool LooseEquals(const Value& a, const Value& b);
// JavaScript's `===` on primitive values (the reference's `in` over an array).
bool StrictEquals(const Value& a, const Value& b);

}  // namespace connex::serving::jinja

#endif  // CONNEX_SERVING_JINJA_VALUE_H_
