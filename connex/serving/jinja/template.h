// A Jinja template of the subset that Hugging Face chat templates use, rendered exactly as
// @huggingface/jinja (transformers.js's renderer) renders it: parse once, render many times.
// docs/design/chat-template.md lists the subset. Thread-safe: a parsed Template is immutable and
// may be rendered from several threads at once.
#ifndef CONNEX_SERVING_JINJA_TEMPLATE_H_
#define CONNEX_SERVING_JINJA_TEMPLATE_H_

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace connex::serving::jinja {

struct Node;

struct RenderOptions {
  // The local time `strftime_now()` formats; the machine's local time when empty. Tests inject one.
  std::function<std::tm()> local_time;
};

class Template {
 public:
  // InvalidArgument "template line L column C: …" for a syntax error or a construct outside the
  // subset, naming it.
  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with `variables` (a JSON object: messages, add_generation_prompt, bos_token, …; key
  // order is kept, so `tojson` prints a dict as it was given). InvalidArgument naming the template
  // position and the construct on an error, "…: raise_exception: MESSAGE" when the template
  // raises.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables,
                                     const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const std::vector<std::unique_ptr<Node>>> program)
      : program_(std::move(program)) {}
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> program_;
};

}  // namespace connex::serving::jinja

#endif  // CONNEX_SERVING_JINJA_TEMPLATE_H_
