#include "connex/serving/openai_response.h"

#include <utility>

#include "connex/base/strings.h"
#include "connex/serving/api_error.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

bool IsChat(const ResponseHeader& header) { return header.endpoint == Endpoint::kChatCompletions; }

Json Envelope(const ResponseHeader& header, std::string_view object) {
  return Json{{"id", header.id},
              {"object", std::string(object)},
              {"created", header.created},
              {"model", header.model}};
}

Json FinishJson(std::optional<FinishReason> finish) {
  if (!finish) return nullptr;
  return std::string(FinishReasonName(*finish));
}

Json UsageJson(const Usage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

Json Ids(std::span<const int32_t> ids) {
  return Json(std::vector<int32_t>(ids.begin(), ids.end()));
}

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

std::string SseEvent(std::string_view json) { return StrCat("data: ", json, "\n\n"); }

ChunkBuilder::ChunkBuilder(ResponseHeader header, bool include_usage)
    : header_(std::move(header)), include_usage_(include_usage) {}

std::string ChunkBuilder::Delta(std::string_view text, std::span<const int32_t> token_ids,
                                std::span<const int32_t> prompt_token_ids,
                                std::optional<FinishReason> finish) {
  Json choice = {
      {"index", 0}, {"finish_reason", FinishJson(finish)}, {"token_ids", Ids(token_ids)}};
  if (first_) choice["prompt_token_ids"] = Ids(prompt_token_ids);
  if (IsChat(header_)) {
    Json delta = Json::object();
    if (first_) delta["role"] = "assistant";
    if (first_ || !text.empty()) delta["content"] = std::string(text);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = std::string(text);
    choice["logprobs"] = nullptr;
  }
  first_ = false;
  Json chunk = Envelope(header_, IsChat(header_) ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array({std::move(choice)});
  if (include_usage_) chunk["usage"] = nullptr;
  return SseEvent(Dump(chunk));
}

std::string ChunkBuilder::UsageChunk(const Usage& usage) const {
  Json chunk = Envelope(header_, IsChat(header_) ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array();
  chunk["usage"] = UsageJson(usage);
  return SseEvent(Dump(chunk));
}

std::string ChunkBuilder::ErrorEvent(const absl::Status& status) {
  return SseEvent(ErrorEnvelope(status));
}

std::string ModelsResponse(std::span<const std::string> models, int64_t created) {
  Json data = Json::array();
  for (const std::string& model : models) {
    data.push_back(
        {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "connex"}});
  }
  return Dump(Json{{"object", "list"}, {"data", std::move(data)}});
}

std::string HealthResponse(bool ready, std::string_view reason) {
  if (ready) return Dump(Json{{"status", "ok"}});
  return Dump(Json{{"status", "unavailable"}, {"reason", std::string(reason)}});
}

}  // namespace connex::serving
