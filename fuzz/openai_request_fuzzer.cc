// libFuzzer target: any request body must give a CompletionRequest or a Status with an error
// envelope, never crash, throw or hang; an accepted request's text (any bytes) must go through the
// chat template, the stop-string filter and the response builders.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "connex/serving/api_error.h"
#include "connex/serving/chat_template.h"
#include "connex/serving/openai_api.h"
#include "connex/serving/openai_response.h"
#include "connex/serving/openai_stream.h"
#include "connex/serving/stop_strings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace connex::serving;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  RequestLimits limits;
  limits.models = {"tiny"};
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(endpoint, body, limits);
    if (!request.ok()) {
      (void)ErrorEnvelope(request.status());
      continue;
    }
    std::string text = request->prompt_text.value_or(RenderChatPrompt(request->messages));
    StopStringFilter filter(request->stop);
    std::string streamed;
    for (size_t i = 0; i < text.size(); i += 3) streamed += filter.Append(text.substr(i, 3));
    streamed += filter.Finish();
    ResponseHeader header{endpoint, MakeResponseId(endpoint, size), 0, request->model};
    ChunkBuilder chunks(header, request->include_usage);
    (void)chunks.Delta(streamed, request->prompt_token_ids, request->prompt_token_ids,
                       FinishReason::kStop);
    (void)CompletionResponse(
        header, Completion{streamed, {}, request->prompt_token_ids, FinishReason::kLength});
  }
  return 0;
}
