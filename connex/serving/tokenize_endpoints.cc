#include "connex/serving/tokenize_endpoints.h"

#include <string>
#include <vector>

#include "connex/base/json_text.h"
#include "connex/base/strings.h"
#include "connex/serving/api_error.h"
#include "connex/serving/router.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

std::string Dump(const nlohmann::ordered_json& j) { return DumpJson(j); }

// A failure of the prompt's input (`prompt` or `messages`): 400 naming it, unless it already
// names a field (a render error of the template is the conversation's).
absl::Status OfInput(const absl::Status& status, std::string_view param) {
  if (ApiParam(status)) return status;
  return InvalidRequest(param, "invalid_value", AsStd(status.message()));
}

}  // namespace

HttpResponse TokenizeResponse(const ModelText& text, const RequestLimits& limits,
                              int64_t max_model_len, std::string_view body) {
  absl::StatusOr<TokenizeRequest> req = ParseTokenizeRequest(body, limits);
  if (!req.ok()) return ErrorResponse(req.status());
  absl::StatusOr<std::vector<int32_t>> ids =
      req->prompt ? text.CompletionPrompt(*req->prompt, req->add_special_tokens)
                  : text.ChatPrompt(req->messages, req->add_generation_prompt);
  if (!ids.ok()) return ErrorResponse(OfInput(ids.status(), req->prompt ? "prompt" : "messages"));
  if (!req->prompt && req->add_special_tokens) {
    // The chat asked for the post-processor's tokens on top of the template's (vLLM allows it).
    absl::StatusOr<std::string> rendered =
        text.RenderChat(req->messages, req->add_generation_prompt);
    if (rendered.ok()) ids = text.CompletionPrompt(*rendered, /*add_special_tokens=*/true);
    if (!ids.ok()) return ErrorResponse(OfInput(ids.status(), "messages"));
  }
  nlohmann::ordered_json j = {
      {"count", ids->size()}, {"max_model_len", max_model_len}, {"tokens", *ids}};
  if (req->return_token_strs) {
    std::vector<std::string> strs;
    for (int32_t id : *ids) strs.push_back(text.tokenizer().TokenText(id).value_or(""));
    j["token_strs"] = strs;
  }
  return JsonResponse(200, Dump(j));
}

HttpResponse DetokenizeResponse(const ModelText& text, const RequestLimits& limits,
                                std::string_view body) {
  absl::StatusOr<std::vector<int32_t>> ids = ParseDetokenizeRequest(body, limits);
  if (!ids.ok()) return ErrorResponse(ids.status());
  // The tokenizer's vocabulary may be smaller than the model's (Qwen's padded rows): still named.
  absl::StatusOr<std::string> decoded = text.tokenizer().Decode(*ids, engine::DecodeOptions{});
  if (!decoded.ok()) return ErrorResponse(OfInput(decoded.status(), "tokens"));
  return JsonResponse(200, Dump(nlohmann::ordered_json{{"prompt", *decoded}}));
}

}  // namespace connex::serving
