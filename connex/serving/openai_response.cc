#include "connex/serving/openai_response.h"

#include <utility>

#include "connex/base/strings.h"
#include "connex/serving/internal/openai_json.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using Json = nlohmann::json;
using internal::Dump;
using internal::Envelope;
using internal::Ids;
using internal::IsChat;
using internal::UsageJson;

}  // namespace

std::string_view FinishReasonName(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

std::string MakeResponseId(Endpoint endpoint, uint64_t unique) {
  return fmt::format("{}-{:016x}", endpoint == Endpoint::kCompletions ? "cmpl" : "chatcmpl",
                     unique);
}

std::string CompletionResponse(const ResponseHeader& header, const Completion& completion) {
  Json choice = {{"index", 0},
                 {"finish_reason", FinishReasonName(completion.finish_reason)},
                 {"token_ids", Ids(completion.token_ids)},
                 {"prompt_token_ids", Ids(completion.prompt_token_ids)}};
  if (IsChat(header)) {
    choice["message"] = {{"role", "assistant"}, {"content", completion.text}};
  } else {
    choice["text"] = completion.text;
    choice["logprobs"] = nullptr;
  }
  Json body = Envelope(header, IsChat(header) ? "chat.completion" : "text_completion");
  body["choices"] = Json::array({std::move(choice)});
  body["usage"] = UsageJson({static_cast<int64_t>(completion.prompt_token_ids.size()),
                             static_cast<int64_t>(completion.token_ids.size())});
  return Dump(body);
}

namespace {

Json ModelObject(std::string_view model, int64_t created) {
  return {{"id", std::string(model)},
          {"object", "model"},
          {"created", created},
          {"owned_by", "connex"}};
}

}  // namespace

std::string ModelsResponse(std::span<const std::string> models, int64_t created) {
  Json data = Json::array();
  for (const std::string& model : models) data.push_back(ModelObject(model, created));
  return Dump(Json{{"object", "list"}, {"data", std::move(data)}});
}

std::string ModelResponse(std::string_view model, int64_t created) {
  return Dump(ModelObject(model, created));
}

std::string ModelIdOfPath(std::string_view path) {
  constexpr std::string_view kPrefix = "/v1/models/";
  if (path.starts_with(kPrefix)) path.remove_prefix(kPrefix.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string id;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 2 < path.size() && hex(path[i + 1]) >= 0 && hex(path[i + 2]) >= 0) {
      id += static_cast<char>(hex(path[i + 1]) * 16 + hex(path[i + 2]));
      i += 2;
    } else {
      id += path[i];
    }
  }
  return id;
}

std::string HealthResponse(bool ready, std::string_view reason) {
  if (ready) return Dump(Json{{"status", "ok"}});
  return Dump(Json{{"status", "unavailable"}, {"reason", std::string(reason)}});
}

}  // namespace connex::serving
