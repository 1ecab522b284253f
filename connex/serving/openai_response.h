// Response builders of the OpenAI-compatible API: the non-streaming `text_completion` and
// `chat.completion` bodies, the streaming chunks (`text_completion` / `chat.completion.chunk`),
// the usage chunk, the in-stream error event and the `[DONE]` terminator, framed as server-sent
// events; and the bodies of `GET /v1/models` and `GET /health`. Beyond OpenAI's fields every
// choice carries `token_ids` (the tokens behind its text) and the first chunk (or the one choice
// of a non-streaming response) `prompt_token_ids`, so that a resumer never re-encodes text.
// All output is compact JSON; text that is not valid UTF-8 has the bad bytes replaced by U+FFFD.
// Thread-compatible (ChunkBuilder); the free functions are thread-safe.
#ifndef CONNEX_SERVING_OPENAI_RESPONSE_H_
#define CONNEX_SERVING_OPENAI_RESPONSE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
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

// `data: <json>\n\n` (json must be one line, as every builder here makes it).
std::string SseEvent(std::string_view json);
// The stream's terminator, `data: [DONE]\n\n`.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// The chunks of one streamed response, each already framed as an SSE event.
class ChunkBuilder {
 public:
  // `include_usage`: stream_options.include_usage — every chunk carries "usage": null and
  // UsageChunk ends the stream's data.
  ChunkBuilder(ResponseHeader header, bool include_usage);

  // A chunk of generated text with its tokens; `finish` on the last one. The first chunk also
  // carries `prompt_token_ids` (and, for chat, the delta's role "assistant").
  std::string Delta(std::string_view text, std::span<const int32_t> token_ids,
                    std::span<const int32_t> prompt_token_ids,
                    std::optional<FinishReason> finish = std::nullopt);

  // The usage chunk, `choices: []`.
  std::string UsageChunk(const Usage& usage) const;

  // An error after the stream started: one more event with the error envelope. The stream then
  // ends with kSseDone.
  static std::string ErrorEvent(const absl::Status& status);

 private:
  ResponseHeader header_;
  bool include_usage_;
  bool first_ = true;
};

// `GET /v1/models`: {"object": "list", "data": [{"id", "object": "model", "created",
// "owned_by": "connex"}]}.
std::string ModelsResponse(std::span<const std::string> models, int64_t created);

// `GET /health`: {"status": "ok"} when ready, else {"status": "unavailable", "reason": ...}
// (served with 200 and 503).
std::string HealthResponse(bool ready, std::string_view reason);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_OPENAI_RESPONSE_H_
