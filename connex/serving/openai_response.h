// Response bodies of the OpenAI-compatible API: the non-streaming `text_completion` and
// `chat.completion` bodies, and those of `GET /v1/models` and `GET /health` (the streamed chunks
// are openai_stream.h's). Beyond OpenAI's fields the choice carries `token_ids` (the tokens behind
// its text) and `prompt_token_ids`, so that a resumer never re-encodes text. All output is compact
// JSON; text that is not valid UTF-8 has the bad bytes replaced by U+FFFD. Thread-safe.
#ifndef CONNEX_SERVING_OPENAI_RESPONSE_H_
#define CONNEX_SERVING_OPENAI_RESPONSE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "connex/serving/openai_api.h"

namespace connex::serving {

enum class FinishReason { kStop, kLength };
std::string_view FinishReasonName(FinishReason reason);  // "stop", "length"

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// What every response and chunk of one request repeats.
struct ResponseHeader {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // MakeResponseId
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// "cmpl-<16 hex digits>" or "chatcmpl-<16 hex digits>" from a number unique to the request.
std::string MakeResponseId(Endpoint endpoint, uint64_t unique);

// A whole generation, for the non-streaming response.
struct Completion {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> prompt_token_ids;
  FinishReason finish_reason = FinishReason::kStop;
};

// The non-streaming body: `text_completion` with choices[0].text, or `chat.completion` with
// choices[0].message {role: assistant, content}; usage from the token counts.
std::string CompletionResponse(const ResponseHeader& header, const Completion& completion);

// `GET /v1/models`: {"object": "list", "data": [{"id", "object": "model", "created",
// "owned_by": "connex"}]}.
std::string ModelsResponse(std::span<const std::string> models, int64_t created);

// `GET /v1/models/{id}`: the model object of `model` as ModelsResponse lists it.
std::string ModelResponse(std::string_view model, int64_t created);
// The {id} of a `/v1/models/{id}` path: the rest of the path (a model name may hold '/', as
// Hugging Face names do), percent-decoded.
std::string ModelIdOfPath(std::string_view path);

// `GET /health`: {"status": "ok"} when ready, else {"status": "unavailable", "reason": ...}
// (served with 200 and 503).
std::string HealthResponse(bool ready, std::string_view reason);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_OPENAI_RESPONSE_H_
