#include "connex/serving/internal/upstream.h"

#include <algorithm>

#include "connex/base/strings.h"
#include "nlohmann/json.hpp"

namespace connex::serving::internal {

using Json = nlohmann::json;

std::string UpstreamBody(const CompletionRequest& r, std::span<const int32_t> resume_prompt,
                         int64_t max_tokens) {
  Json body = Json::object();
  body["model"] = r.model;
  if (!resume_prompt.empty()) {
    body["prompt"] = std::vector<int32_t>(resume_prompt.begin(), resume_prompt.end());
  } else if (r.endpoint == Endpoint::kChatCompletions) {
    Json messages = Json::array();
    for (const ChatMessage& m : r.messages) {
      messages.push_back({{"role", m.role}, {"content", m.content}});
    }
    body["messages"] = std::move(messages);
  } else if (r.prompt_text) {
    body["prompt"] = *r.prompt_text;
  } else {
    body["prompt"] = r.prompt_token_ids;
  }
  body["max_tokens"] = max_tokens;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (!r.stop.empty()) body["stop"] = r.stop;
  if (r.seed) body["seed"] = *r.seed;
  body["temperature"] = r.temperature;
  body["top_p"] = r.top_p;
  if (r.top_k > 0) body["top_k"] = r.top_k;
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ErrorMessageOf(const std::string& body) {
  Json envelope = Json::parse(body, nullptr, false);
  if (envelope.is_object() && envelope.contains("error") && envelope["error"].is_object() &&
      envelope["error"].contains("message") && envelope["error"]["message"].is_string()) {
    return envelope["error"]["message"].get<std::string>();
  }
  return body.substr(0, 200);
}

}  // namespace connex::serving::internal
