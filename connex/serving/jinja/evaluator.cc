#include "connex/serving/jinja/evaluator.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "connex/base/status.h"
#include "connex/serving/jinja/builtins.h"
#include "connex/serving/jinja/text.h"

namespace connex::serving::jinja {
namespace {

// One level of names: the render's globals and variables, or a for loop's body.
class Scope {
 public:
  explicit Scope(Scope* parent) : parent_(parent) {}
  Value Lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent_) {
      auto it = s->names_.find(name);
      if (it != s->names_.end()) return it->second;
    }
    return Value();
  }
  bool HasOwn(const std::string& name) const { return names_.contains(name); }
  void Set(const std::string& name, Value value) { names_[name] = std::move(value); }

 private:
  Scope* parent_;
  absl::flat_hash_map<std::string, Value> names_;
};

absl::Status At(const Node& node, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("template line ", node.position.line, " column ",
                                                 node.position.column, ": ", what));
}
absl::Status At(const Node& node, const absl::Status& status) {
  return At(node, std::string(status.message()));
}

// Walks a program's tree: renders statements, evaluates expressions. Holds no state of its own
// (the scopes carry the render's names), so one per render.
class Evaluator {
 public:
  absl::Status RenderBlock(const std::vector<NodePtr>& block, Scope& scope, std::string* out);
  absl::StatusOr<Value> Eval(const Node& node, Scope& scope);

 private:
  absl::Status RenderFor(const Node& node, Scope& scope, std::string* out);
  absl::Status ExecuteSet(const Node& node, Scope& scope);
  absl::StatusOr<CallArgs> EvalArgs(const Node& call, Scope& scope);
  absl::StatusOr<Value> EvalMember(const Node& node, Scope& scope);
  absl::StatusOr<Value> EvalSlice(const Node& node, const Value& object, Scope& scope);
  absl::StatusOr<Value> EvalBinary(const Node& node, Scope& scope);
  absl::StatusOr<Value> EvalFilter(const Node& node, Scope& scope);
};

absl::Status Evaluator::RenderBlock(const std::vector<NodePtr>& block, Scope& scope,
                                    std::string* out) {
  for (const NodePtr& node : block) {
    switch (node->kind) {
      case NodeKind::kText:
        *out += node->text;
        break;
      case NodeKind::kComment:
        break;
      case NodeKind::kIf: {
        CONNEX_ASSIGN_OR_RETURN(Value test, Eval(*node->children[0], scope));
        CONNEX_RETURN_IF_ERROR(
            RenderBlock(test.Truthy() ? node->body : node->alternate, scope, out));
        break;
      }
      case NodeKind::kFor:
        CONNEX_RETURN_IF_ERROR(RenderFor(*node, scope, out));
        break;
      case NodeKind::kSet:
        CONNEX_RETURN_IF_ERROR(ExecuteSet(*node, scope));
        break;
      default: {
        CONNEX_ASSIGN_OR_RETURN(Value value, Eval(*node, scope));
        auto text = ToOutput(value);
        if (!text.ok()) return At(*node, text.status());
        *out += *text;
      }
    }
  }
  return absl::OkStatus();
}

void Bind(const Node& target, const Value& item, Scope& scope) {
  if (target.kind == NodeKind::kIdentifier) {
    scope.Set(target.text, item);
    return;
  }
  for (size_t i = 0; i < target.children.size(); ++i) {
    scope.Set(target.children[i]->text, item.items()[i]);
  }
}

absl::Status Evaluator::RenderFor(const Node& node, Scope& scope, std::string* out) {
  Scope loop_scope(&scope);
  const Node& target = *node.children[0];
  const Node* iterable_node = node.children[1].get();
  const Node* condition = nullptr;
  if (iterable_node->kind == NodeKind::kSelect) {
    condition = iterable_node->children[1].get();
    iterable_node = iterable_node->children[0].get();
  }
  CONNEX_ASSIGN_OR_RETURN(Value iterable, Eval(*iterable_node, loop_scope));
  std::vector<Value> candidates;
  if (iterable.is_array()) {
    candidates = iterable.items();
  } else if (iterable.is_object()) {
    for (const auto& entry : iterable.members().entries()) {
      candidates.push_back(Value::String(entry.first));
    }
  } else {
    return At(*iterable_node,
              absl::StrCat("for: cannot iterate over a ", iterable.TypeName(), " value"));
  }
  std::vector<Value> items;
  for (const Value& candidate : candidates) {
    if (target.kind == NodeKind::kTuple) {
      if (!candidate.is_array()) {
        return At(target, absl::StrCat("for: cannot unpack a ", candidate.TypeName(), " value"));
      }
      for (const NodePtr& name : target.children) {
        if (name->kind != NodeKind::kIdentifier)
          return At(*name, "for: can only unpack into names");
      }
      if (candidate.items().size() != target.children.size()) {
        return At(target, absl::StrCat("for: cannot unpack ", candidate.items().size(),
                                       " items into ", target.children.size(), " names"));
      }
    }
    if (condition != nullptr) {
      Scope test_scope(&loop_scope);
      Bind(target, candidate, test_scope);
      CONNEX_ASSIGN_OR_RETURN(Value keep, Eval(*condition, test_scope));
      if (!keep.Truthy()) continue;
    }
    items.push_back(candidate);
  }
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    Members loop;
    loop.Set("index", Value::Int(i + 1));
    loop.Set("index0", Value::Int(i));
    loop.Set("revindex", Value::Int(length - i));
    loop.Set("revindex0", Value::Int(length - i - 1));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == length - 1));
    loop.Set("length", Value::Int(length));
    loop.Set("previtem", i > 0 ? items[i - 1] : Value());
    loop.Set("nextitem", i < length - 1 ? items[i + 1] : Value());
    loop_scope.Set("loop", Value::Object(std::move(loop)));
    Bind(target, items[i], loop_scope);
    CONNEX_RETURN_IF_ERROR(RenderBlock(node.body, loop_scope, out));
  }
  if (items.empty()) CONNEX_RETURN_IF_ERROR(RenderBlock(node.alternate, loop_scope, out));
  return absl::OkStatus();
}

absl::Status Evaluator::ExecuteSet(const Node& node, Scope& scope) {
  Value value;
  if (node.children[1] != nullptr) {
    CONNEX_ASSIGN_OR_RETURN(value, Eval(*node.children[1], scope));
  } else {
    std::string text;
    CONNEX_RETURN_IF_ERROR(RenderBlock(node.body, scope, &text));
    value = Value::String(std::move(text));
  }
  const Node& target = *node.children[0];
  switch (target.kind) {
    case NodeKind::kIdentifier:
      scope.Set(target.text, std::move(value));
      return absl::OkStatus();
    case NodeKind::kTuple: {
      if (!value.is_array()) {
        return At(target, absl::StrCat("set: cannot unpack a ", value.TypeName(), " value"));
      }
      if (value.items().size() != target.children.size()) {
        return At(target, absl::StrCat("set: cannot unpack ", value.items().size(), " items into ",
                                       target.children.size(), " names"));
      }
      for (size_t i = 0; i < target.children.size(); ++i) {
        if (target.children[i]->kind != NodeKind::kIdentifier) {
          return At(*target.children[i], "set: can only unpack into names");
        }
        scope.Set(target.children[i]->text, value.items()[i]);
      }
      return absl::OkStatus();
    }
    case NodeKind::kMember: {
      CONNEX_ASSIGN_OR_RETURN(Value object, Eval(*target.children[0], scope));
      if (object.kind() != Value::Kind::kNamespace) {
        return At(target, absl::StrCat("set: cannot assign an attribute of a ", object.TypeName(),
                                       " value (only of a namespace())"));
      }
      const Node& property = *target.children[1];
      if (target.computed || property.kind != NodeKind::kIdentifier) {
        return At(target, "set: a namespace attribute must be a name");
      }
      object.members().Set(property.text, std::move(value));
      return absl::OkStatus();
    }
    default:
      return At(target, "set: the target must be a name, a tuple of names or ns.attribute");
  }
}

absl::StatusOr<CallArgs> Evaluator::EvalArgs(const Node& call, Scope& scope) {
  CallArgs args;
  for (size_t i = 1; i < call.children.size(); ++i) {
    const Node& arg = *call.children[i];
    if (arg.kind == NodeKind::kKeywordArg) {
      CONNEX_ASSIGN_OR_RETURN(Value value, Eval(*arg.children[0], scope));
      if (args.Keyword(arg.text) != nullptr) {
        return At(arg, absl::StrCat("keyword argument '", arg.text, "' given twice"));
      }
      args.keyword.emplace_back(arg.text, std::move(value));
    } else {
      CONNEX_ASSIGN_OR_RETURN(Value value, Eval(arg, scope));
      args.positional.push_back(std::move(value));
    }
  }
  return args;
}

absl::StatusOr<Value> Evaluator::Eval(const Node& node, Scope& scope) {
  switch (node.kind) {
    case NodeKind::kIdentifier:
      return scope.Lookup(node.text);
    case NodeKind::kInt:
      return Value::Int(node.int_value);
    case NodeKind::kFloat:
      return Value::Float(node.float_value);
    case NodeKind::kString:
      return Value::String(node.text);
    case NodeKind::kArray:
    case NodeKind::kTuple: {
      std::vector<Value> items;
      for (const NodePtr& child : node.children) {
        CONNEX_ASSIGN_OR_RETURN(Value item, Eval(*child, scope));
        items.push_back(std::move(item));
      }
      return Value::Array(std::move(items));
    }
    case NodeKind::kObject: {
      Members members;
      for (size_t i = 0; i + 1 < node.children.size(); i += 2) {
        CONNEX_ASSIGN_OR_RETURN(Value key, Eval(*node.children[i], scope));
        if (!key.is_string()) {
          return At(*node.children[i],
                    absl::StrCat("dict keys must be strings, not ", key.TypeName()));
        }
        CONNEX_ASSIGN_OR_RETURN(Value value, Eval(*node.children[i + 1], scope));
        members.Set(key.str(), std::move(value));
      }
      return Value::Object(std::move(members));
    }
    case NodeKind::kMember:
      return EvalMember(node, scope);
    case NodeKind::kCall: {
      CONNEX_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(node, scope));
      CONNEX_ASSIGN_OR_RETURN(Value callee, Eval(*node.children[0], scope));
      if (callee.kind() != Value::Kind::kFunction) {
        return At(node, absl::StrCat("cannot call a ", callee.TypeName(), " value"));
      }
      auto result = callee.function()(args);
      if (!result.ok()) return At(node, result.status());
      return result;
    }
    case NodeKind::kBinary:
      return EvalBinary(node, scope);
    case NodeKind::kUnary: {
      CONNEX_ASSIGN_OR_RETURN(Value argument, Eval(*node.children[0], scope));
      if (node.text == "not") return Value::Bool(!argument.Truthy());
      const double sign = node.text == "-" ? -1 : 1;
      switch (argument.kind()) {
        case Value::Kind::kFloat:
          return Value::Float(sign * argument.float_value());
        case Value::Kind::kInt:
        case Value::Kind::kBool:
          return Value::Number(sign * argument.number());
        default:
          return At(node,
                    absl::StrCat("unary '", node.text, "' on a ", argument.TypeName(), " value"));
      }
    }
    case NodeKind::kFilter:
      return EvalFilter(node, scope);
    case NodeKind::kTest: {
      CONNEX_ASSIGN_OR_RETURN(Value operand, Eval(*node.children[0], scope));
      auto result = ApplyTest(node.text, operand);
      if (!result.ok()) return At(node, result.status());
      return Value::Bool(node.negate ? !*result : *result);
    }
    case NodeKind::kTernary: {
      CONNEX_ASSIGN_OR_RETURN(Value test, Eval(*node.children[0], scope));
      return Eval(*node.children[test.Truthy() ? 1 : 2], scope);
    }
    case NodeKind::kSelect: {
      CONNEX_ASSIGN_OR_RETURN(Value test, Eval(*node.children[1], scope));
      if (!test.Truthy()) return Value();
      return Eval(*node.children[0], scope);
    }
    case NodeKind::kIf:
    case NodeKind::kFor:
    case NodeKind::kSet:
    case NodeKind::kText:
    case NodeKind::kComment:
      return At(node, "a statement where an expression was expected");
    case NodeKind::kSlice:
    case NodeKind::kKeywordArg:
      return At(node, "a slice or keyword argument outside a subscript or call");
  }
  return At(node, "unknown expression");
}

absl::StatusOr<Value> Evaluator::EvalSlice(const Node& node, const Value& object, Scope& scope) {
  std::optional<int64_t> bounds[3];
  for (int i = 0; i < 3; ++i) {
    if (node.children[i] == nullptr) continue;
    CONNEX_ASSIGN_OR_RETURN(Value v, Eval(*node.children[i], scope));
    if (v.is_undefined()) continue;
    if (v.kind() != Value::Kind::kInt) {
      return At(node, absl::StrCat("slice bounds must be integers, not ", v.TypeName()));
    }
    bounds[i] = v.int_value();
  }
  std::vector<std::string_view> points;
  if (object.is_string()) points = SplitCodePoints(object.str());
  const int64_t n = object.is_string() ? static_cast<int64_t>(points.size())
                                       : static_cast<int64_t>(object.items().size());
  const int64_t step = bounds[2].value_or(1);
  int64_t start, stop;
  if (step >= 0) {
    start = bounds[0].value_or(0);
    start = start < 0 ? std::max<int64_t>(n + start, 0) : std::min(start, n);
    stop = bounds[1].value_or(n);
    stop = stop < 0 ? std::max<int64_t>(n + stop, 0) : std::min(stop, n);
  } else {
    start = bounds[0].value_or(n - 1);
    start = start < 0 ? std::max<int64_t>(n + start, -1) : std::min(start, n - 1);
    stop = bounds[1].value_or(-1);
    stop = stop < -1 ? std::max<int64_t>(n + stop, -1) : std::min(stop, n - 1);
  }
  const int64_t direction = step > 0 ? 1 : (step < 0 ? -1 : 0);
  std::vector<Value> items;
  std::string text;
  for (int64_t i = start; direction * i < direction * stop; i += step) {
    if (object.is_string()) {
      text += points[i];
    } else {
      items.push_back(object.items()[i]);
    }
  }
  if (object.is_string()) return Value::String(std::move(text));
  return Value::Array(std::move(items));
}

absl::StatusOr<Value> Evaluator::EvalMember(const Node& node, Scope& scope) {
  CONNEX_ASSIGN_OR_RETURN(Value object, Eval(*node.children[0], scope));
  const Node& property_node = *node.children[1];
  if (node.computed && property_node.kind == NodeKind::kSlice) {
    if (!object.is_array() && !object.is_string()) {
      return At(node, absl::StrCat("cannot slice a ", object.TypeName(), " value"));
    }
    return EvalSlice(property_node, object, scope);
  }
  Value property;
  if (node.computed) {
    CONNEX_ASSIGN_OR_RETURN(property, Eval(property_node, scope));
  } else if (property_node.kind == NodeKind::kInt) {
    property = Value::Int(property_node.int_value);
  } else {
    property = Value::String(property_node.text);
  }
  if (object.is_object() || object.kind() == Value::Kind::kNamespace) {
    if (!property.is_string()) {
      return At(node, absl::StrCat("a dict's key must be a string, not ", property.TypeName()));
    }
    if (const Value* found = object.members().Find(property.str())) return *found;
    return object.is_object() ? MemberBuiltin(object, property.str()) : Value();
  }
  if (object.is_array() || object.is_string()) {
    if (property.kind() == Value::Kind::kInt) {
      std::vector<std::string_view> points;
      if (object.is_string()) points = SplitCodePoints(object.str());
      const int64_t n = object.is_string() ? static_cast<int64_t>(points.size())
                                           : static_cast<int64_t>(object.items().size());
      int64_t index = property.int_value();
      if (index < 0) index += n;
      if (index < 0 || index >= n) return Value();
      if (object.is_string()) return Value::String(std::string(points[index]));
      return object.items()[index];
    }
    if (property.is_string()) return MemberBuiltin(object, property.str());
    return At(node,
              absl::StrCat("an index must be an integer or a name, not ", property.TypeName()));
  }
  if (!property.is_string()) {
    return At(node, absl::StrCat("cannot index a ", object.TypeName(), " value with a ",
                                 property.TypeName()));
  }
  return Value();
}

absl::StatusOr<Value> Evaluator::EvalFilter(const Node& node, Scope& scope) {
  CONNEX_ASSIGN_OR_RETURN(Value operand, Eval(*node.children[0], scope));
  const Node& filter = *node.children[1];
  if (filter.kind == NodeKind::kIdentifier) {
    auto result = ApplyFilter(filter.text, operand, nullptr);
    if (!result.ok()) return At(filter, result.status());
    return result;
  }
  const Node& callee = *filter.children[0];
  if (callee.kind != NodeKind::kIdentifier) return At(filter, "a filter must be a name");
  CONNEX_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(filter, scope));
  auto result = ApplyFilter(callee.text, operand, &args);
  if (!result.ok()) return At(callee, result.status());
  return result;
}

absl::StatusOr<Value> Evaluator::EvalBinary(const Node& node, Scope& scope) {
  CONNEX_ASSIGN_OR_RETURN(Value left, Eval(*node.children[0], scope));
  if (node.text == "and") return left.Truthy() ? Eval(*node.children[1], scope) : left;
  if (node.text == "or") return left.Truthy() ? left : Eval(*node.children[1], scope);
  CONNEX_ASSIGN_OR_RETURN(Value right, Eval(*node.children[1], scope));
  auto result = BinaryOperation(node.text, left, right);
  if (!result.ok()) return At(node, result.status());
  return result;
}

}  // namespace

absl::StatusOr<std::string> Render(const std::vector<NodePtr>& program, const Members& variables,
                                   const std::function<std::tm()>& local_time) {
  Scope globals(nullptr);
  const Members global_names = GlobalNames(local_time);
  for (const auto& [name, value] : global_names.entries()) globals.Set(name, value);
  for (const auto& [name, value] : variables.entries()) {
    if (globals.HasOwn(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("template variable '", name, "' would shadow the global of that name"));
    }
    globals.Set(name, value);
  }
  std::string out;
  Evaluator evaluator;
  CONNEX_RETURN_IF_ERROR(evaluator.RenderBlock(program, globals, &out));
  return out;
}

}  // namespace connex::serving::jinja
