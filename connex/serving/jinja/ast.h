// The syntax tree of a parsed Jinja template (see parser.h). One node type with a kind keeps the
// tree small; the comment on each kind says which fields it uses. Thread-compatible (immutable
// once parsed, so a parsed template may be rendered from several threads).
#ifndef CONNEX_SERVING_JINJA_AST_H_
#define CONNEX_SERVING_JINJA_AST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "connex/serving/jinja/lexer.h"

namespace connex::serving::jinja {

enum class NodeKind {
  // Statements.
  kText,     // text: the literal output
  kComment,  // nothing
  kIf,       // children[0] test; body; alternate (an elif is one nested kIf)
  kFor,      // children[0] loop variable (kIdentifier or kTuple), children[1] iterable (may be a
             // kSelect: `for x in xs if cond`); body; alternate: the `else` block
  kSet,  // children[0] target, children[1] value, or null with body: `{% set x %}…{% endset %}`
  // Expressions.
  kIdentifier,  // text: the name
  kInt,         // int_value
  kFloat,       // float_value
  kString,      // text
  kArray,       // children: the items
  kTuple,       // children: the items
  kObject,      // children: key, value, key, value, …
  kMember,      // children[0] object, children[1] property; computed: `a[b]` rather than `a.b`
  kSlice,       // children[0..2]: start, stop, step (each may be null); only as a kMember property
  kCall,        // children[0] callee, then the arguments (kKeywordArg for `name=value`)
  kKeywordArg,  // text: the name; children[0] the value
  kBinary,      // text: the operator; children[0], children[1]
  kUnary,       // text: "not", "-" or "+"; children[0]
  kFilter,      // children[0] operand, children[1] the filter (kIdentifier, or kCall of one)
  kTest,        // children[0] operand; text: the test's name; negate: `is not`
  kTernary,     // children: condition, value if true, value if false
  kSelect,      // children: value, condition (`value if condition` with no else)
};

struct Node {
  NodeKind kind;
  Position position;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  bool negate = false;
  bool computed = false;
  std::vector<std::unique_ptr<Node>> children;
  std::vector<std::unique_ptr<Node>> body;
  std::vector<std::unique_ptr<Node>> alternate;
};

using NodePtr = std::unique_ptr<Node>;

}  // namespace connex::serving::jinja

#endif  // CONNEX_SERVING_JINJA_AST_H_
