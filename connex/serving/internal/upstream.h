// The proxy's side of one upstream attempt (connex/serving/proxy.cc): the body it sends a stage-0
// replica — the client's request, or a resume with the prompt's token ids plus those delivered —
// and the message of an error it answers (its streamed events are openai_stream.h's). Pure
// functions.
#ifndef CONNEX_SERVING_INTERNAL_UPSTREAM_H_
#define CONNEX_SERVING_INTERNAL_UPSTREAM_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "connex/serving/openai_api.h"

namespace connex::serving::internal {

// The body of one upstream attempt: the client's request with the proxy's seed, always streamed
// with usage; a resume (`resume_prompt` not empty) sends the prompt's token ids plus those
// delivered, to /v1/completions, with what is left of max_tokens.
std::string UpstreamBody(const CompletionRequest& r, std::span<const int32_t> resume_prompt,
                         int64_t max_tokens);

// The message of an OpenAI error envelope, else the body's start.
std::string ErrorMessageOf(const std::string& body);

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_UPSTREAM_H_
