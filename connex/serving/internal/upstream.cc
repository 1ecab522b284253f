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

namespace {

std::vector<int32_t> TokenIds(const Json& value) {
  std::vector<int32_t> out;
  if (!value.is_array()) return out;
  out.reserve(value.size());
  for (const Json& v : value) {
    if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  }
  return out;
}

}  // namespace

absl::StatusOr<UpstreamEvent> ParseUpstreamEvent(std::string_view data) {
  UpstreamEvent event;
  if (data == "[DONE]") {
    event.kind = UpstreamEvent::Kind::kDone;
    return event;
  }
  Json json = Json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return absl::DataLossError(StrCat("an event that is not a JSON object: ",
                                      data.substr(0, std::min<size_t>(data.size(), 80))));
  }
  if (auto error = json.find("error"); error != json.end()) {
    event.kind = UpstreamEvent::Kind::kError;
    event.error_json = std::string(data);
    if (error->is_object()) {
      if (auto m = error->find("message"); m != error->end() && m->is_string()) {
        event.error_message = m->get<std::string>();
      }
      auto type = error->find("type");
      event.server_error = type != error->end() && type->is_string() && *type == "server_error";
    }
    return event;
  }
  auto choices = json.find("choices");
  if (choices == json.end() || !choices->is_array()) {
    return absl::DataLossError("a chunk without choices");
  }
  if (choices->empty()) {
    event.kind = UpstreamEvent::Kind::kUsage;
    return event;
  }
  const Json& choice = (*choices)[0];
  if (!choice.is_object()) return absl::DataLossError("a choice that is not an object");
  if (auto text = choice.find("text"); text != choice.end() && text->is_string()) {
    event.text = text->get<std::string>();
  } else if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
    if (auto content = delta->find("content"); content != delta->end() && content->is_string()) {
      event.text = content->get<std::string>();
    }
  }
  if (auto ids = choice.find("token_ids"); ids != choice.end()) event.token_ids = TokenIds(*ids);
  if (auto ids = choice.find("prompt_token_ids"); ids != choice.end()) {
    event.prompt_token_ids = TokenIds(*ids);
  }
  if (auto finish = choice.find("finish_reason"); finish != choice.end() && finish->is_string()) {
    event.finish = *finish == "stop" ? FinishReason::kStop : FinishReason::kLength;
  }
  return event;
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
