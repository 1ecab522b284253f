// The filters, tests, methods and global functions of the Jinja subset, with the semantics of
// @huggingface/jinja (the reference renderer of Hugging Face chat templates). Errors name the
// filter, test or method and the type it was applied to; the evaluator adds the template position.
// Thread-safe (pure, apart from what the given clock does).
#ifndef CONNEX_SERVING_JINJA_BUILTINS_H_
#define CONNEX_SERVING_JINJA_BUILTINS_H_

#include <ctime>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "connex/serving/jinja/value.h"

namespace connex::serving::jinja {

// `operand | name` (args null) or `operand | name(args…)`.
absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& operand,
                                  const CallArgs* args);

// `left op right` for every binary operator but `and` and `or` (which the evaluator short-cuts).
absl::StatusOr<Value> BinaryOperation(std::string_view op, const Value& left, const Value& right);

// `operand is name`. InvalidArgument for an unknown test.
absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& operand);

// `object.name` where `object` has no such member: a string's or dict's method bound to it, or a
// string's or list's `length`; undefined if there is none.
Value MemberBuiltin(const Value& object, std::string_view name);

// The global names every render sees: true/false/none (and True/False/None), namespace(),
// raise_exception(message), range(), strftime_now(format) over `local_time`.
Members GlobalNames(std::function<std::tm()> local_time);

// Helpers shared by the filters and the methods of the same name.
std::string TitleCase(std::string_view text);
std::string Capitalize(std::string_view text);
absl::StatusOr<Value> ReplaceMethod(const std::string& self, const CallArgs& args);

// strftime with the directives the reference knows (%Y %m %d %b %B %H %M %%; English month names);
// any other directive is kept as written.
std::string FormatTime(const std::tm& time, std::string_view format);

}  // namespace connex::serving::jinja

#endif  // CONNEX_SERVING_JINJA_BUILTINS_H_
