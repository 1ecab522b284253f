// The OpenAI request model: parses and validates the JSON bodies of `POST /v1/completions` and
// `POST /v1/chat/completions` into a typed CompletionRequest. Every refusal is a Status whose
// ApiParam names the field and whose ApiCode says what was wrong (api_error.h), so the server
// answers with the OpenAI error envelope: 400 for malformed JSON, wrong types, missing fields,
// out-of-range values and unsupported parameters, 404 (`model_not_found`) for a model this server
// does not serve. docs/serving.md lists every field and rule. Thread-safe (pure functions).
#ifndef CONNEX_SERVING_OPENAI_API_H_
#define CONNEX_SERVING_OPENAI_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace connex::serving {

enum class Endpoint { kCompletions, kChatCompletions };

// The request path of an endpoint ("/v1/completions", "/v1/chat/completions").
std::string_view EndpointPath(Endpoint endpoint);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Bounds of what one request may ask for; the stage runner fills them from its model.
struct RequestLimits {
  // Names a request may give as `model`; empty accepts any name.
  std::vector<std::string> models;
  // Token ids in a prompt must be below it (the reference engine's byte vocabulary by default).
  int64_t vocab_size = 258;
  // `max_tokens` when the request gives none.
  int64_t default_max_tokens = 16;
  // > 0: the largest `max_tokens` accepted (the model's context length, say).
  int64_t max_tokens_limit = 0;
  // `stop`: at most this many strings, each at most this many bytes (OpenAI allows 4).
  int64_t max_stop_strings = 4;
  int64_t max_stop_bytes = 256;
  // Nesting depth of the JSON body beyond which it is refused (the body is untrusted).
  int max_json_depth = 32;
};

// What a request that omits a sampling field gets. The built-in values (greedy, unlike OpenAI's
// temperature 1) unless the server applies the model's generation_config.json
// (`--generation-config auto`, as vLLM does).
struct SamplingDefaults {
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t top_k = -1;
  double min_p = 0.0;
  double repetition_penalty = 1.0;

  bool operator==(const SamplingDefaults&) const = default;
};

// A validated request. Exactly one of `prompt_text`, `prompt_token_ids` (completions) or
// `messages` (chat) is the input.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::optional<std::string> prompt_text;  // `prompt` as a string (or an array of one string)
  std::vector<int32_t> prompt_token_ids;   // `prompt` as token ids, used exactly as given
  std::vector<ChatMessage> messages;       // chat: the conversation, in order
  int64_t max_tokens = 16;                 // default applied; chat: max_completion_tokens wins
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;  // a negative seed is taken modulo 2^64
  // The sampling fields as the request gives them; absent ones take the server's defaults
  // (SamplingDefaults) where the request is served, so that a proxy forwards only what was given.
  std::optional<double> temperature;  // [0, 2]; 0: greedy
  std::optional<double> top_p;        // (0, 1]
  std::optional<int64_t> top_k;       // -1 or 0: no top-k cut
  // vLLM's extensions (docs/serving.md):
  std::optional<double> min_p;  // [0, 1]: drop tokens below min_p x the top's probability
  std::optional<double> repetition_penalty;  // > 0; 1: none
  bool ignore_eos = false;                   // EOS does not end the completion
  std::vector<int32_t> stop_token_ids;       // each ends the completion (finish_reason "stop")
};

// Parses `body` as a request to `endpoint`. Unknown fields are ignored, as OpenAI does; fields
// OpenAI defines that Connex does not implement (logprobs, echo, best_of > 1, logit_bias, tools,
// response_format other than text, n > 1, suffix, penalties other than 0, ...) are refused with
// code "unsupported_parameter" or "unsupported_value". A JSON `null` is the same as an absent
// field.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(Endpoint endpoint, std::string_view body,
                                                         const RequestLimits& limits);

// `POST /tokenize`, in vLLM's shape: {"prompt": "..."} (add_special_tokens, default true) or
// {"messages": [...]} (add_generation_prompt, default true; add_special_tokens, default false:
// the template writes BOS); `model` optional; return_token_strs adds each token's text.
struct TokenizeRequest {
  std::optional<std::string> prompt;  // else `messages`
  std::vector<ChatMessage> messages;
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
  bool return_token_strs = false;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body,
                                                     const RequestLimits& limits);

// `POST /detokenize`: {"tokens": [id, ...]} (each in [0, vocab)), `model` optional.
absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                            const RequestLimits& limits);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_OPENAI_API_H_
