#include "connex/serving/jinja/template.h"

#include <utility>

#include "absl/status/status.h"
#include "connex/base/status.h"
#include "connex/serving/jinja/ast.h"
#include "connex/serving/jinja/evaluator.h"
#include "connex/serving/jinja/lexer.h"
#include "connex/serving/jinja/parser.h"
#include "connex/serving/jinja/value.h"

namespace connex::serving::jinja {

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  CONNEX_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  CONNEX_ASSIGN_OR_RETURN(std::vector<NodePtr> program, jinja::Parse(tokens));
  return Template(std::make_shared<const std::vector<NodePtr>>(std::move(program)));
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& variables,
                                             const RenderOptions& options) const {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError("template variables must be a JSON object");
  }
  Members members;
  for (const auto& [name, value] : variables.items()) members.Set(name, Value::FromJson(value));
  std::function<std::tm()> local_time = options.local_time;
  if (!local_time) {
    local_time = [] {
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      return tm;
    };
  }
  return jinja::Render(*program_, members, local_time);
}

}  // namespace connex::serving::jinja
