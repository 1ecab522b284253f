#include "connex/chaos/http_client.h"

#include <algorithm>
#include <memory>

#include "absl/strings/numbers.h"
#include "connex/base/strings.h"
#include "connex/serving/http_client.h"
#include "connex/serving/openai_stream.h"

namespace connex::chaos {
namespace {

// Takes the events `reader` has whole (fed the body as it arrives); appends what they carry.
// Returns false once [DONE] has been read.
bool TakeEvents(serving::OpenAiStreamReader& reader, int64_t now, StreamResult* out,
                const std::function<void(int32_t, int64_t)>& on_token) {
  while (!reader.done()) {
    absl::StatusOr<std::optional<serving::StreamEvent>> event = reader.Next();
    if (!event.ok()) {  // a malformed event: noted, and the stream read on
      if (out->error.empty()) out->error = std::string(event.status().message());
      if (reader.broken()) return false;
      continue;
    }
    if (!*event) return true;
    const serving::StreamEvent& e = **event;
    if (e.kind == serving::StreamEvent::Kind::kError) {
      if (out->error.empty()) out->error = "error event: " + e.error_json;
      continue;
    }
    if (!e.id.empty() && std::find(out->response_ids.begin(), out->response_ids.end(), e.id) ==
                             out->response_ids.end()) {
      out->response_ids.push_back(e.id);
    }
    if (e.total_tokens >= 0 || e.prompt_tokens >= 0 || e.completion_tokens >= 0) {
      out->prompt_tokens = e.prompt_tokens;
      out->completion_tokens = e.completion_tokens;
      out->total_tokens = e.total_tokens;
    }
    for (int32_t token : e.token_ids) {
      out->tokens.push_back(token);
      out->token_ns.push_back(now);
      if (on_token) on_token(token, now);
    }
    out->text += e.text;
    if (e.finish) out->finish_reason = std::string(serving::FinishReasonName(*e.finish));
  }
  return false;
}

}  // namespace

int64_t MonotonicNowNs() { return serving::SteadyNowNs(); }

absl::StatusOr<HostPort> ParseHostPort(std::string_view what, std::string_view text) {
  size_t colon = text.rfind(':');
  uint32_t port = 0;
  if (colon == std::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(text.data() + colon + 1, text.size() - colon - 1),
                        &port) ||
      port == 0 || port > 65535) {
    return absl::InvalidArgumentError(StrCat(what, " \"", text, "\": expected HOST:PORT"));
  }
  return HostPort{std::string(text.substr(0, colon)), static_cast<uint16_t>(port)};
}

absl::StatusOr<HttpReply> HttpGet(const HostPort& at, const std::string& target,
                                  int64_t timeout_ms) {
  return serving::HttpGet(at.host, at.port, target, timeout_ms);
}

StreamResult StreamCompletion(const HostPort& at, const std::string& body, int64_t idle_timeout_ms,
                              int64_t total_timeout_ms,
                              const std::function<void(int32_t, int64_t)>& on_token) {
  StreamResult out;
  out.start_ns = MonotonicNowNs();
  const int64_t deadline_ns = out.start_ns + total_timeout_ms * 1'000'000;
  auto finish = [&out](std::string error) {
    if (out.error.empty()) out.error = std::move(error);
    out.end_ns = MonotonicNowNs();
    return out;
  };
  // Each step must make progress within the idle timeout, and the whole end by the deadline.
  auto step_deadline = [&] {
    return std::min(MonotonicNowNs() + idle_timeout_ms * 1'000'000, deadline_ns);
  };
  auto failed = [&](std::string_view doing, const absl::Status& status) {
    if (status.code() != absl::StatusCode::kDeadlineExceeded) {
      return finish(StrCat(doing, ": ", status.message()));
    }
    if (MonotonicNowNs() >= deadline_ns) return finish("no end within the request timeout");
    return finish(StrCat(doing, ": nothing received for ", idle_timeout_ms, " ms"));
  };
  absl::StatusOr<std::unique_ptr<serving::HttpClientConnection>> connection =
      serving::HttpClientConnection::Connect(at.host, at.port, step_deadline());
  if (!connection.ok()) return failed("connect", connection.status());
  serving::HttpClientConnection& http = **connection;
  if (absl::Status sent = http.Send("POST", "/v1/completions", {StrCat("Host: ", at.host)}, body,
                                    "application/json", step_deadline());
      !sent.ok()) {
    return failed("send", sent);
  }
  absl::StatusOr<serving::HttpResponseHead> head = http.ReadHead(step_deadline());
  if (!head.ok()) return failed("response head", head.status());
  out.http_status = head->status;
  out.began_on = head->Header("X-Connex-Replica").value_or("");
  out.retry_after = head->Header("Retry-After").value_or("");
  serving::OpenAiStreamReader reader;
  std::string bytes;
  while (true) {
    absl::StatusOr<bool> more = http.ReadSome(&bytes, step_deadline());
    if (!more.ok()) {
      if (more.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return failed("read", more.status());
      }
      break;  // the connection ended or broke: judged below by what the stream carried
    }
    if (out.http_status == 200) {
      reader.Feed(bytes);
      bytes.clear();
      if (!TakeEvents(reader, MonotonicNowNs(), &out, on_token)) break;
    }
    if (!*more) break;
  }
  if (out.http_status != 200) {
    return finish(StrCat("HTTP ", out.http_status, ": ", bytes.substr(0, 300)));
  }
  if (!reader.done()) return finish("the stream ended without [DONE]");
  if (out.finish_reason.empty()) return finish("the stream ended without a finish_reason");
  return finish("");
}

}  // namespace connex::chaos
