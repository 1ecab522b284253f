// Renders a parsed template (parser.h) against a set of variables, with @huggingface/jinja's
// semantics: undefined names and missing attributes are undefined (falsy, print nothing), `for`
// and its body share one child scope, `set` writes the innermost scope. Thread-safe (a render owns
// its scopes and values; the program is only read).
#ifndef CONNEX_SERVING_JINJA_EVALUATOR_H_
#define CONNEX_SERVING_JINJA_EVALUATOR_H_

#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/serving/jinja/ast.h"
#include "connex/serving/jinja/value.h"

namespace connex::serving::jinja {

// The output of `program`. `variables` are the render's names (messages, bos_token, …); a name
// that is also a global (true, range, namespace, …) is InvalidArgument, as in the reference.
// Errors are InvalidArgument "template line L column C: …" naming the construct, filter, test or
// method; raise_exception(message) gives "…: raise_exception: message".
absl::StatusOr<std::string> Render(const std::vector<NodePtr>& program, const Members& variables,
                                   const std::function<std::tm()>& local_time);

}  // namespace connex::serving::jinja

#endif  // CONNEX_SERVING_JINJA_EVALUATOR_H_
