#include "connex/serving/openai_stream.h"

#include <algorithm>
#include <utility>

#include "connex/base/json_text.h"
#include "connex/base/strings.h"
#include "connex/serving/api_error.h"
#include "connex/serving/internal/openai_json.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using Json = nlohmann::json;
using internal::Dump;
using internal::Envelope;
using internal::Ids;
using internal::IsChat;
using internal::UsageJson;

// At most this much of a bad event goes into an error message.
constexpr size_t kQuoteBytes = 80;

std::string_view Quote(std::string_view data) {
  return data.substr(0, std::min(data.size(), kQuoteBytes));
}

std::vector<int32_t> TokenIds(const Json& value) {
  std::vector<int32_t> out;
  if (!value.is_array()) return out;
  out.reserve(value.size());
  for (const Json& v : value) {
    if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  }
  return out;
}

int64_t Count(const Json& usage, const char* name) {
  auto it = usage.find(name);
  return it != usage.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

}  // namespace

// ---- Writing ----

std::string SseEvent(std::string_view json) { return StrCat("data: ", json, "\n\n"); }

ChunkBuilder::ChunkBuilder(ResponseHeader header, bool include_usage)
    : header_(std::move(header)), include_usage_(include_usage) {}

std::string ChunkBuilder::Delta(std::string_view text, std::span<const int32_t> token_ids,
                                std::span<const int32_t> prompt_token_ids,
                                std::optional<FinishReason> finish) {
  Json choice = {{"index", 0},
                 {"finish_reason", finish ? Json(FinishReasonName(*finish)) : Json(nullptr)},
                 {"token_ids", Ids(token_ids)}};
  if (first_) choice["prompt_token_ids"] = Ids(prompt_token_ids);
  if (IsChat(header_)) {
    Json delta = Json::object();
    if (first_) delta["role"] = "assistant";
    if (first_ || !text.empty()) delta["content"] = std::string(text);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = std::string(text);
    choice["logprobs"] = nullptr;
  }
  first_ = false;
  Json chunk = Envelope(header_, IsChat(header_) ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array({std::move(choice)});
  if (include_usage_) chunk["usage"] = nullptr;
  return SseEvent(Dump(chunk));
}

std::string ChunkBuilder::UsageChunk(const Usage& usage) const {
  Json chunk = Envelope(header_, IsChat(header_) ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array();
  chunk["usage"] = UsageJson(usage);
  return SseEvent(Dump(chunk));
}

std::string ChunkBuilder::End(const Usage& usage) const {
  if (!include_usage_) return std::string(kSseDone);
  return StrCat(UsageChunk(usage), kSseDone);
}

std::string ChunkBuilder::ErrorEvent(const absl::Status& status) {
  return SseEvent(ErrorEnvelope(status));
}

std::string ChunkBuilder::ErrorEnd(const absl::Status& status) {
  return StrCat(ErrorEvent(status), kSseDone);
}

std::string ChunkBuilder::ErrorEnd(std::string_view envelope_json) {
  Json envelope = ParseJson(envelope_json);
  if (!envelope.is_object()) return ErrorEnd(absl::InternalError(std::string(envelope_json)));
  return StrCat(SseEvent(Dump(envelope)), kSseDone);
}

// ---- Reading ----

SseReader::SseReader(size_t max_event_bytes) : max_event_bytes_(max_event_bytes) {}

void SseReader::Feed(std::string_view bytes) {
  if (!status_.ok()) return;
  // What was taken goes once it is most of the buffer (appends stay amortised O(1)).
  if (scan_ > 0 && scan_ >= buffer_.size() / 2) {
    buffer_.erase(0, scan_);
    scan_ = 0;
  }
  buffer_.append(bytes);
}

absl::StatusOr<std::optional<std::string>> SseReader::Next() {
  if (!status_.ok()) return status_;
  while (true) {
    const size_t end = buffer_.find('\n', scan_);
    if (end == std::string::npos) break;
    std::string_view line(buffer_.data() + scan_, end - scan_);
    scan_ = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {  // the end of an event
      if (!has_data_) continue;
      std::string data = std::move(data_);
      data_.clear();
      has_data_ = false;
      return std::optional<std::string>(std::move(data));
    }
    if (line.front() == ':') continue;  // a comment
    const size_t colon = line.find(':');
    if (line.substr(0, colon) != "data") continue;  // event, id, retry, or a field we do not know
    std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (has_data_) data_ += '\n';
    data_ += value;
    has_data_ = true;
    if (data_.size() > max_event_bytes_) break;
  }
  if (buffered() > max_event_bytes_) {
    status_ = absl::DataLossError(
        StrCat("an event over ", max_event_bytes_, " bytes (no end in sight): ", Quote(data_)));
    return status_;
  }
  return std::optional<std::string>();
}

absl::StatusOr<StreamEvent> ParseStreamEvent(std::string_view data) {
  StreamEvent event;
  if (data == "[DONE]") {
    event.kind = StreamEvent::Kind::kDone;
    return event;
  }
  Json json = ParseJson(data);
  if (!json.is_object()) {
    return absl::DataLossError(StrCat("an event that is not a JSON object: ", Quote(data)));
  }
  if (auto error = json.find("error"); error != json.end()) {
    event.kind = StreamEvent::Kind::kError;
    event.error_json = std::string(data);
    if (error->is_object()) {
      if (auto m = error->find("message"); m != error->end() && m->is_string()) {
        event.error_message = m->get<std::string>();
      }
      auto type = error->find("type");
      event.server_error = type != error->end() && type->is_string() && *type == "server_error";
    }
    return event;
  }
  if (auto id = json.find("id"); id != json.end() && id->is_string()) {
    event.id = id->get<std::string>();
  }
  if (auto usage = json.find("usage"); usage != json.end() && usage->is_object()) {
    event.prompt_tokens = Count(*usage, "prompt_tokens");
    event.completion_tokens = Count(*usage, "completion_tokens");
    event.total_tokens = Count(*usage, "total_tokens");
  }
  auto choices = json.find("choices");
  if (choices == json.end() || !choices->is_array()) {
    return absl::DataLossError(StrCat("a chunk without choices: ", Quote(data)));
  }
  if (choices->empty()) {
    event.kind = StreamEvent::Kind::kUsage;
    return event;
  }
  const Json& choice = (*choices)[0];
  if (!choice.is_object()) {
    return absl::DataLossError(StrCat("a choice that is not an object: ", Quote(data)));
  }
  if (auto text = choice.find("text"); text != choice.end() && text->is_string()) {
    event.text = text->get<std::string>();
  } else if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
    if (auto content = delta->find("content"); content != delta->end() && content->is_string()) {
      event.text = content->get<std::string>();
    }
  }
  if (auto ids = choice.find("token_ids"); ids != choice.end()) event.token_ids = TokenIds(*ids);
  if (auto ids = choice.find("prompt_token_ids"); ids != choice.end()) {
    event.prompt_token_ids = TokenIds(*ids);
  }
  if (auto finish = choice.find("finish_reason"); finish != choice.end() && !finish->is_null()) {
    if (*finish == "stop") {
      event.finish = FinishReason::kStop;
    } else if (*finish == "length") {
      event.finish = FinishReason::kLength;
    } else {
      return absl::DataLossError(
          StrCat("a finish_reason other than stop or length: ", Quote(DumpJson(*finish))));
    }
  }
  return event;
}

absl::StatusOr<std::optional<StreamEvent>> OpenAiStreamReader::Next() {
  absl::StatusOr<std::optional<std::string>> data = sse_.Next();
  if (!data.ok()) return data.status();
  if (!*data) return std::optional<StreamEvent>();
  ++events_;
  absl::StatusOr<StreamEvent> event = ParseStreamEvent(**data);
  if (!event.ok()) {
    return absl::DataLossError(StrCat("event ", events_, ": ", event.status().message()));
  }
  if (event->kind == StreamEvent::Kind::kDone) done_ = true;
  return std::optional<StreamEvent>(*std::move(event));
}

}  // namespace connex::serving
