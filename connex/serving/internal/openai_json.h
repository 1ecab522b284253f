// The JSON pieces that the OpenAI response bodies (openai_response.cc) and the streamed chunks
// (openai_stream.cc) share, so that both write the same fields the same way. Thread-safe.
#ifndef CONNEX_SERVING_INTERNAL_OPENAI_JSON_H_
#define CONNEX_SERVING_INTERNAL_OPENAI_JSON_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "connex/base/json_text.h"
#include "connex/serving/openai_response.h"
#include "nlohmann/json.hpp"

namespace connex::serving::internal {

// Compact, with bytes that are not valid UTF-8 replaced by U+FFFD.
inline std::string Dump(const nlohmann::json& json) { return DumpJson(json); }

inline bool IsChat(const ResponseHeader& header) {
  return header.endpoint == Endpoint::kChatCompletions;
}

// {"id", "object", "created", "model"}: what every response and chunk repeats.
inline nlohmann::json Envelope(const ResponseHeader& header, std::string_view object) {
  return nlohmann::json{{"id", header.id},
                        {"object", std::string(object)},
                        {"created", header.created},
                        {"model", header.model}};
}

inline nlohmann::json UsageJson(const Usage& usage) {
  return nlohmann::json{{"prompt_tokens", usage.prompt_tokens},
                        {"completion_tokens", usage.completion_tokens},
                        {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

inline nlohmann::json Ids(std::span<const int32_t> ids) {
  return nlohmann::json(std::vector<int32_t>(ids.begin(), ids.end()));
}

}  // namespace connex::serving::internal

#endif  // CONNEX_SERVING_INTERNAL_OPENAI_JSON_H_
