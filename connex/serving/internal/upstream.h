// The proxy's side of one upstream attempt (connex/serving/proxy.cc): the body it sends a stage-0
// replica — the client's request, or a resume with the prompt's token ids plus those delivered —
// and the events of the replica's streamed answer, parsed. Pure functions.
#ifndef CONNEX_SERVING_INTERNAL_UPSTREAM_H_
#define CONNEX_SERVING_INTERNAL_UPSTREAM_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/serving/openai_api.h"
#include "connex/serving/openai_response.h"

namespace connex::serving::internal {

// The body of one upstream attempt: the client's request with the proxy's seed, always streamed
// with usage; a resume (`resume_prompt` not empty) sends the prompt's token ids plus those
// delivered, to /v1/completions, with what is left of max_tokens.
std::string UpstreamBody(const CompletionRequest& r, std::span<const int32_t> resume_prompt,
                         int64_t max_tokens);

// One event of an upstream stream.
struct UpstreamEvent {
  enum class Kind { kChunk, kUsage, kDone, kError } kind = Kind::kChunk;
  // kChunk
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> prompt_token_ids;
  std::optional<FinishReason> finish;
  // kError: the envelope as sent, and whether it is the server's fault (worth a retry).
  std::string error_json;
  std::string error_message;
  bool server_error = false;
};

// `data` is what follows "data: " in one event. DataLoss names what is wrong with it.
absl::StatusOr<UpstreamEvent> ParseUpstreamEvent(std::string_view data);

// The message of an OpenAI error envelope, else the body's start.
std::string ErrorMessageOf(const std::string& body);

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_UPSTREAM_H_
