#include "connex/serving/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/serving/api_error.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using Json = nlohmann::json;

// Thrown by the parser callback past the depth limit; caught in ParseBody, never leaves this file.

// The JSON type name a client sees in a message ("a string", "an integer", ...).
std::string TypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

absl::Status WrongType(std::string_view param, std::string_view expected, const Json& got) {
  return InvalidRequest(param, "invalid_type",
                        StrCat("'", param, "' must be ", expected, ", got ", TypeName(got)));
}

absl::Status BadValue(std::string_view param, std::string_view what) {
  return InvalidRequest(param, "invalid_value", StrCat("'", param, "' ", what));
}

absl::Status Unsupported(std::string_view param, std::string_view what) {
  return InvalidRequest(param, "unsupported_parameter",
                        StrCat("'", param, "' ", what, " is not supported by this server"));
}

absl::StatusOr<Json> ParseBody(std::string_view body, int max_depth) {
  absl::StatusOr<Json> parsed = ParseJsonChecked(body, max_depth);
  if (absl::IsOutOfRange(parsed.status())) {
    return InvalidRequest("", "invalid_json",
                          StrCat("the request body nests deeper than ", max_depth, " levels"));
  }
  if (!parsed.ok()) {
    return InvalidRequest(
        "", "invalid_json",
        StrCat("the request body is not valid JSON: ", parsed.status().message()));
  }
  if (!parsed->is_object()) {
    return InvalidRequest(
        "", "invalid_type",
        StrCat("the request body must be a JSON object, got ", TypeName(*parsed)));
  }
  return parsed;
}

// Reads the fields of one JSON object; a field that is absent or null reads as "not given".
class FieldReader {
 public:
  explicit FieldReader(const Json& object) : object_(object) {}

  const Json* Find(std::string_view name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<std::optional<std::string>> String(std::string_view name) const {
    const Json* value = Find(name);
    if (value == nullptr) return std::optional<std::string>();
    if (!value->is_string()) return WrongType(name, "a string", *value);
    return std::optional<std::string>(value->get<std::string>());
  }

  absl::StatusOr<std::optional<bool>> Bool(std::string_view name) const {
    const Json* value = Find(name);
    if (value == nullptr) return std::optional<bool>();
    if (!value->is_boolean()) return WrongType(name, "a boolean", *value);
    return std::optional<bool>(value->get<bool>());
  }

  // An integer in [min, max]; `param` is the name shown to the client.
  absl::StatusOr<std::optional<int64_t>> Int(std::string_view name, int64_t min, int64_t max,
                                             std::string_view param = {}) const {
    if (param.empty()) param = name;
    const Json* value = Find(name);
    if (value == nullptr) return std::optional<int64_t>();
    if (!value->is_number_integer()) return WrongType(param, "an integer", *value);
    if (value->is_number_unsigned() &&
        value->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return BadValue(param, StrCat("must be at most ", max));
    }
    int64_t v = value->get<int64_t>();
    if (v < min || v > max) {
      return BadValue(param, StrCat("must be in [", min, ", ", max, "], got ", v));
    }
    return std::optional<int64_t>(v);
  }

  absl::StatusOr<std::optional<double>> Number(std::string_view name) const {
    const Json* value = Find(name);
    if (value == nullptr) return std::optional<double>();
    if (!value->is_number()) return WrongType(name, "a number", *value);
    return std::optional<double>(value->get<double>());
  }

 private:
  const Json& object_;
};

// Fields Connex refuses unless they hold the value that means "off".
absl::Status RefuseUnsupported(const FieldReader& fields) {
  // Absent, null, false, 0, "", [] and {} all mean "not asked for".
  auto asked = [&](std::string_view name) {
    const Json* value = fields.Find(name);
    if (value == nullptr) return false;
    if (value->is_boolean()) return value->get<bool>();
    if (value->is_number()) return value->get<double>() != 0.0;
    if (value->is_string() || value->is_array() || value->is_object()) return !value->empty();
    return true;
  };
  for (std::string_view name :
       {"logprobs", "top_logprobs", "echo", "logit_bias", "suffix", "tools", "tool_choice",
        "functions", "function_call", "presence_penalty", "frequency_penalty", "audio",
        "modalities", "prediction", "web_search_options"}) {
    if (asked(name)) return Unsupported(name, "");
  }
  if (const Json* best_of = fields.Find("best_of");
      best_of != nullptr && !(best_of->is_number_integer() && best_of->get<int64_t>() == 1)) {
    return InvalidRequest("best_of", "unsupported_value",
                          "'best_of' must be 1: this server generates one completion per request");
  }
  if (const Json* n = fields.Find("n");
      n != nullptr && !(n->is_number_integer() && n->get<int64_t>() == 1)) {
    if (!n->is_number_integer()) return WrongType("n", "an integer", *n);
    return InvalidRequest("n", "unsupported_value",
                          "'n' must be 1: this server generates one completion per request");
  }
  if (const Json* format = fields.Find("response_format"); format != nullptr) {
    if (!format->is_object()) return WrongType("response_format", "an object", *format);
    auto type = format->find("type");
    if (type == format->end() || *type != "text") {
      return InvalidRequest("response_format", "unsupported_value",
                            "'response_format' supports only {\"type\": \"text\"}");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseTokenIds(const Json& array, std::string_view param, const RequestLimits& limits,
                           std::vector<int32_t>* out) {
  if (array.empty()) return BadValue(param, "must not be an empty list of token ids");
  out->reserve(array.size());
  for (const Json& id : array) {
    if (!id.is_number_integer()) return WrongType(param, "a list of integer token ids", id);
    int64_t v = id.get<int64_t>();  // an unsigned id past int64 reads as negative
    if (v < 0 || v >= limits.vocab_size) {
      return BadValue(param, StrCat("holds token id ", DumpJson(id), " outside the vocabulary [0, ",
                                    limits.vocab_size, ")"));
    }
    out->push_back(static_cast<int32_t>(v));
  }
  return absl::OkStatus();
}

// `prompt`: a string, a list of one string, a list of token ids, or a list of one list of token
// ids. Several prompts in one request are refused (n = 1 and one choice per response).
absl::Status ParsePrompt(const FieldReader& fields, const RequestLimits& limits,
                         CompletionRequest* request) {
  const Json* prompt = fields.Find("prompt");
  if (prompt == nullptr) {
    return InvalidRequest("prompt", "missing_required_parameter", "'prompt' is required");
  }
  if (prompt->is_string()) {
    request->prompt_text = prompt->get<std::string>();
    return absl::OkStatus();
  }
  if (!prompt->is_array()) {
    return WrongType("prompt", "a string, a list of token ids, or a list of one of those", *prompt);
  }
  if (prompt->empty()) return BadValue("prompt", "must not be an empty list");
  const Json& first = prompt->front();
  if (first.is_number_integer()) {
    return ParseTokenIds(*prompt, "prompt", limits, &request->prompt_token_ids);
  }
  if (prompt->size() > 1) {
    return InvalidRequest("prompt", "unsupported_value",
                          StrCat("'prompt' holds ", prompt->size(),
                                 " prompts; this server takes one prompt per request"));
  }
  if (first.is_string()) {
    request->prompt_text = first.get<std::string>();
    return absl::OkStatus();
  }
  if (first.is_array()) return ParseTokenIds(first, "prompt", limits, &request->prompt_token_ids);
  return WrongType("prompt", "a string, a list of token ids, or a list of one of those", first);
}

absl::StatusOr<std::string> ParseContent(const Json& content, std::string_view param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return WrongType(param, "a string or a list of text parts", content);
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object()) return WrongType(param, "a list of text parts", part);
    auto type = part.find("type");
    auto part_text = part.find("text");
    if (type == part.end() || *type != "text") {
      return InvalidRequest(param, "unsupported_value",
                            StrCat("'", param, "' may hold only parts of type \"text\""));
    }
    if (part_text == part.end() || !part_text->is_string()) {
      return InvalidRequest(param, "invalid_type",
                            StrCat("a text part of '", param, "' needs a string 'text'"));
    }
    text += part_text->get<std::string>();
  }
  return text;
}

absl::Status ParseMessages(const FieldReader& fields, CompletionRequest* request) {
  const Json* messages = fields.Find("messages");
  if (messages == nullptr) {
    return InvalidRequest("messages", "missing_required_parameter", "'messages' is required");
  }
  if (!messages->is_array()) return WrongType("messages", "a list of messages", *messages);
  if (messages->empty()) return BadValue("messages", "must hold at least one message");
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& message = (*messages)[i];
    std::string param = StrCat("messages[", i, "]");
    if (!message.is_object()) return WrongType(param, "an object", message);
    FieldReader reader(message);
    std::string role_param = StrCat(param, ".role");
    const Json* role = reader.Find("role");
    if (role == nullptr) {
      return InvalidRequest(role_param, "missing_required_parameter",
                            StrCat("'", role_param, "' is required"));
    }
    if (!role->is_string()) return WrongType(role_param, "a string", *role);
    std::string role_name = role->get<std::string>();
    if (role_name != "system" && role_name != "user" && role_name != "assistant") {
      return InvalidRequest(role_param, "unsupported_value",
                            StrCat("'", role_param, "' is '", role_name,
                                   "'; supported roles are system, user and assistant"));
    }
    if (reader.Find("tool_calls") != nullptr || reader.Find("function_call") != nullptr) {
      return Unsupported(StrCat(param, ".tool_calls"), "");
    }
    std::string content_param = StrCat(param, ".content");
    const Json* content = reader.Find("content");
    if (content == nullptr) {
      return InvalidRequest(content_param, "missing_required_parameter",
                            StrCat("'", content_param, "' is required"));
    }
    CONNEX_ASSIGN_OR_RETURN(std::string text, ParseContent(*content, content_param));
    request->messages.push_back(ChatMessage{std::move(role_name), std::move(text)});
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const FieldReader& fields, const RequestLimits& limits,
                       CompletionRequest* request) {
  const Json* stop = fields.Find("stop");
  if (stop == nullptr) return absl::OkStatus();
  std::vector<const Json*> items;
  if (stop->is_string()) {
    items.push_back(stop);
  } else if (stop->is_array()) {
    for (const Json& item : *stop) items.push_back(&item);
  } else {
    return WrongType("stop", "a string or a list of strings", *stop);
  }
  if (static_cast<int64_t>(items.size()) > limits.max_stop_strings) {
    return BadValue("stop", StrCat("holds ", items.size(), " strings; at most ",
                                   limits.max_stop_strings, " are allowed"));
  }
  for (const Json* item : items) {
    if (!item->is_string()) return WrongType("stop", "a string or a list of strings", *item);
    std::string s = item->get<std::string>();
    if (s.empty()) return BadValue("stop", "must not hold an empty string");
    if (static_cast<int64_t>(s.size()) > limits.max_stop_bytes) {
      return BadValue("stop", StrCat("holds a string of ", s.size(), " bytes; at most ",
                                     limits.max_stop_bytes, " are allowed"));
    }
    request->stop.push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const FieldReader& fields, CompletionRequest* request) {
  CONNEX_ASSIGN_OR_RETURN(std::optional<double> temperature, fields.Number("temperature"));
  if (temperature) {
    if (!(*temperature >= 0.0 && *temperature <= 2.0)) {
      return BadValue("temperature", StrCat("must be in [0, 2], got ", *temperature));
    }
    request->temperature = *temperature;
  }
  CONNEX_ASSIGN_OR_RETURN(std::optional<double> top_p, fields.Number("top_p"));
  if (top_p) {
    if (!(*top_p > 0.0 && *top_p <= 1.0)) {
      return BadValue("top_p", StrCat("must be in (0, 1], got ", *top_p));
    }
    request->top_p = *top_p;
  }
  CONNEX_ASSIGN_OR_RETURN(std::optional<int64_t> top_k,
                          fields.Int("top_k", -1, std::numeric_limits<int32_t>::max()));
  if (top_k) request->top_k = *top_k;
  CONNEX_ASSIGN_OR_RETURN(std::optional<double> min_p, fields.Number("min_p"));
  if (min_p) {
    if (!(*min_p >= 0.0 && *min_p <= 1.0)) {
      return BadValue("min_p", StrCat("must be in [0, 1], got ", *min_p));
    }
    request->min_p = *min_p;
  }
  CONNEX_ASSIGN_OR_RETURN(std::optional<double> penalty, fields.Number("repetition_penalty"));
  if (penalty) {
    // It travels as a float: a value beyond float's range would become infinite.
    if (!(*penalty > 0.0 && *penalty <= std::numeric_limits<float>::max())) {
      return BadValue("repetition_penalty",
                      StrCat("must be a finite number > 0 (1: no penalty), got ", *penalty));
    }
    request->repetition_penalty = *penalty;
  }
  if (const Json* seed = fields.Find("seed"); seed != nullptr) {
    if (!seed->is_number_integer()) return WrongType("seed", "an integer", *seed);
    request->seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                               : static_cast<uint64_t>(seed->get<int64_t>());
  }
  return absl::OkStatus();
}

// ignore_eos and stop_token_ids: where the completion ends besides max_tokens and stop strings.
absl::Status ParseStopTokens(const FieldReader& fields, const RequestLimits& limits,
                             CompletionRequest* request) {
  CONNEX_ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, fields.Bool("ignore_eos"));
  request->ignore_eos = ignore_eos.value_or(false);
  const Json* ids = fields.Find("stop_token_ids");
  if (ids == nullptr) return absl::OkStatus();
  if (!ids->is_array()) return WrongType("stop_token_ids", "a list of integer token ids", *ids);
  if (ids->empty()) return absl::OkStatus();  // vLLM's default: none
  return ParseTokenIds(*ids, "stop_token_ids", limits, &request->stop_token_ids);
}

absl::Status ParseLength(const FieldReader& fields, const RequestLimits& limits,
                         CompletionRequest* request) {
  int64_t max =
      limits.max_tokens_limit > 0 ? limits.max_tokens_limit : std::numeric_limits<int32_t>::max();
  CONNEX_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, fields.Int("max_tokens", 1, max));
  request->max_tokens = max_tokens.value_or(limits.default_max_tokens);
  if (request->endpoint == Endpoint::kChatCompletions) {
    CONNEX_ASSIGN_OR_RETURN(std::optional<int64_t> max_completion_tokens,
                            fields.Int("max_completion_tokens", 1, max));
    if (max_completion_tokens) request->max_tokens = *max_completion_tokens;
  }
  return absl::OkStatus();
}

absl::Status ParseStreaming(const FieldReader& fields, CompletionRequest* request) {
  CONNEX_ASSIGN_OR_RETURN(std::optional<bool> stream, fields.Bool("stream"));
  request->stream = stream.value_or(false);
  const Json* options = fields.Find("stream_options");
  if (options == nullptr) return absl::OkStatus();
  if (!options->is_object()) return WrongType("stream_options", "an object", *options);
  if (!request->stream) {
    return BadValue("stream_options", "is allowed only when 'stream' is true");
  }
  const Json* include_usage = FieldReader(*options).Find("include_usage");
  if (include_usage != nullptr) {
    if (!include_usage->is_boolean()) {
      return WrongType("stream_options.include_usage", "a boolean", *include_usage);
    }
    request->include_usage = include_usage->get<bool>();
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view EndpointPath(Endpoint endpoint) {
  return endpoint == Endpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions";
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(Endpoint endpoint, std::string_view body,
                                                         const RequestLimits& limits) {
  CONNEX_ASSIGN_OR_RETURN(Json json, ParseBody(body, limits.max_json_depth));
  FieldReader fields(json);
  CompletionRequest request;
  request.endpoint = endpoint;

  const Json* model = fields.Find("model");
  if (model == nullptr) {
    return InvalidRequest("model", "missing_required_parameter", "'model' is required");
  }
  if (!model->is_string()) return WrongType("model", "a string", *model);
  request.model = model->get<std::string>();

  CONNEX_RETURN_IF_ERROR(RefuseUnsupported(fields));
  if (endpoint == Endpoint::kCompletions) {
    CONNEX_RETURN_IF_ERROR(ParsePrompt(fields, limits, &request));
  } else {
    CONNEX_RETURN_IF_ERROR(ParseMessages(fields, &request));
  }
  CONNEX_RETURN_IF_ERROR(ParseLength(fields, limits, &request));
  CONNEX_RETURN_IF_ERROR(ParseStreaming(fields, &request));
  CONNEX_RETURN_IF_ERROR(ParseStop(fields, limits, &request));
  CONNEX_RETURN_IF_ERROR(ParseSampling(fields, &request));
  CONNEX_RETURN_IF_ERROR(ParseStopTokens(fields, limits, &request));
  CONNEX_ASSIGN_OR_RETURN(std::optional<std::string> user, fields.String("user"));
  (void)user;  // accepted for compatibility; Connex does not use it

  // The model is checked last so that a malformed request is a 400 whatever its model.
  if (!limits.models.empty() &&
      std::find(limits.models.begin(), limits.models.end(), request.model) == limits.models.end()) {
    return ModelNotFound(request.model);
  }
  return request;
}

namespace {

// `model` of a /tokenize or /detokenize body: optional, but a served one when given.
absl::Status CheckOptionalModel(const FieldReader& fields, const RequestLimits& limits) {
  CONNEX_ASSIGN_OR_RETURN(std::optional<std::string> model, fields.String("model"));
  if (model && !limits.models.empty() &&
      std::find(limits.models.begin(), limits.models.end(), *model) == limits.models.end()) {
    return ModelNotFound(*model);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body,
                                                     const RequestLimits& limits) {
  CONNEX_ASSIGN_OR_RETURN(Json json, ParseBody(body, limits.max_json_depth));
  FieldReader fields(json);
  TokenizeRequest request;
  const bool has_prompt = fields.Find("prompt") != nullptr;
  const bool has_messages = fields.Find("messages") != nullptr;
  if (has_prompt == has_messages) {
    return InvalidRequest(has_prompt ? "messages" : "prompt",
                          has_prompt ? "invalid_value" : "missing_required_parameter",
                          "give exactly one of 'prompt' (a string) and 'messages' (a chat)");
  }
  if (has_prompt) {
    CONNEX_ASSIGN_OR_RETURN(request.prompt, fields.String("prompt"));
  } else {
    CompletionRequest chat;
    CONNEX_RETURN_IF_ERROR(ParseMessages(fields, &chat));
    request.messages = std::move(chat.messages);
    request.add_special_tokens = false;
  }
  CONNEX_ASSIGN_OR_RETURN(std::optional<bool> add_special, fields.Bool("add_special_tokens"));
  if (add_special) request.add_special_tokens = *add_special;
  CONNEX_ASSIGN_OR_RETURN(std::optional<bool> add_generation, fields.Bool("add_generation_prompt"));
  if (add_generation) request.add_generation_prompt = *add_generation;
  CONNEX_ASSIGN_OR_RETURN(std::optional<bool> strs, fields.Bool("return_token_strs"));
  request.return_token_strs = strs.value_or(false);
  CONNEX_RETURN_IF_ERROR(CheckOptionalModel(fields, limits));
  return request;
}

absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body,
                                                            const RequestLimits& limits) {
  CONNEX_ASSIGN_OR_RETURN(Json json, ParseBody(body, limits.max_json_depth));
  FieldReader fields(json);
  const Json* tokens = fields.Find("tokens");
  if (tokens == nullptr) {
    return InvalidRequest("tokens", "missing_required_parameter", "'tokens' is required");
  }
  if (!tokens->is_array()) return WrongType("tokens", "a list of integer token ids", *tokens);
  std::vector<int32_t> ids;
  if (!tokens->empty()) CONNEX_RETURN_IF_ERROR(ParseTokenIds(*tokens, "tokens", limits, &ids));
  CONNEX_RETURN_IF_ERROR(CheckOptionalModel(fields, limits));
  return ids;
}

}  // namespace connex::serving
