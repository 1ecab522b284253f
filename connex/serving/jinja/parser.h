// The parser of the Jinja subset that Hugging Face chat templates use, with the operator
// precedence of @huggingface/jinja (the reference renderer): statements `if`/`elif`/`else`,
// `for … in … [if …]` with `else`, `set` (also on a namespace's attribute, of a tuple, and the
// block form); expressions with literals, lists, tuples, dicts, attributes, subscripts and slices,
// calls with keyword arguments, filters, tests, `not`/`and`/`or`, comparisons, `in`/`not in`,
// arithmetic, `~` and the conditional expression. Thread-safe (pure).
#ifndef CONNEX_SERVING_JINJA_PARSER_H_
#define CONNEX_SERVING_JINJA_PARSER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "connex/serving/jinja/ast.h"
#include "connex/serving/jinja/lexer.h"

namespace connex::serving::jinja {

// The template's statements. InvalidArgument naming the line, column and construct for a syntax
// error or a statement outside the subset (macro, call, filter blocks, include, …).
absl::StatusOr<std::vector<NodePtr>> Parse(const std::vector<Token>& tokens);

}  // namespace connex::serving::jinja

#endif  // CONNEX_SERVING_JINJA_PARSER_H_
