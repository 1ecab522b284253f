// POST /tokenize and POST /detokenize of a served model, in vLLM's shape: a prompt or a chat to
// its token ids ({"tokens", "count", "max_model_len"}, and "token_strs" when asked), token ids to
// text ({"prompt"}). Stage 0 answers them with its model's tokenizer and chat template
// (ModelText); connex-proxy forwards them to a stage 0. Refusals are the OpenAI error envelope
// naming the field (400), or model_not_found (404). Thread-safe (pure functions).
#ifndef CONNEX_SERVING_TOKENIZE_ENDPOINTS_H_
#define CONNEX_SERVING_TOKENIZE_ENDPOINTS_H_

#include <cstdint>
#include <string_view>

#include "connex/serving/http_server.h"
#include "connex/serving/model_text.h"
#include "connex/serving/openai_api.h"

namespace connex::serving {

inline constexpr char kTokenizePath[] = "/tokenize";
inline constexpr char kDetokenizePath[] = "/detokenize";

// `limits` carries the served names and the vocabulary; `max_model_len` is the model's context.
HttpResponse TokenizeResponse(const ModelText& text, const RequestLimits& limits,
                              int64_t max_model_len, std::string_view body);
// Text is decoded as Hugging Face's decode() does it by default (special tokens written out, the
// config's clean-up of tokenization spaces).
HttpResponse DetokenizeResponse(const ModelText& text, const RequestLimits& limits,
                                std::string_view body);

}  // namespace connex::serving

#endif  // CONNEX_SERVING_TOKENIZE_ENDPOINTS_H_
