#include "connex/chaos/http_client.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/numbers.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "connex/base/strings.h"
#include "connex/serving/openai_stream.h"

namespace connex::chaos {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;

// Connects `stream` to `at` (a numeric host: every address here is one).
beast::error_code Connect(beast::tcp_stream& stream, const HostPort& at) {
  beast::error_code ec;
  boost::asio::ip::address address = boost::asio::ip::make_address(at.host, ec);
  if (ec) return ec;
  stream.connect(tcp::endpoint(address, at.port), ec);
  return ec;
}

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

int64_t MonotonicNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::milliseconds(timeout_ms));
  if (beast::error_code ec = Connect(stream, at)) {
    return absl::UnavailableError(StrCat("GET ", at.ToString(), target, ": ", ec.message()));
  }
  http::request<http::empty_body> request{http::verb::get, target, 11};
  request.set(http::field::host, at.host);
  beast::error_code ec;
  http::write(stream, request, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  if (!ec) http::read(stream, buffer, response, ec);
  if (ec) return absl::UnavailableError(StrCat("GET ", at.ToString(), target, ": ", ec.message()));
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return HttpReply{static_cast<int>(response.result_int()), response.body()};
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
  boost::asio::io_context io;
  beast::tcp_stream stream(io);
  auto arm = [&] {
    int64_t left_ms = (deadline_ns - MonotonicNowNs()) / 1'000'000;
    stream.expires_after(
        std::chrono::milliseconds(std::max<int64_t>(1, std::min(idle_timeout_ms, left_ms))));
  };
  arm();
  if (beast::error_code ec = Connect(stream, at)) return finish("connect: " + ec.message());
  http::request<http::string_body> request{http::verb::post, "/v1/completions", 11};
  request.set(http::field::host, at.host);
  request.set(http::field::content_type, "application/json");
  request.body() = body;
  request.prepare_payload();
  beast::error_code ec;
  http::write(stream, request, ec);
  if (ec) return finish("send: " + ec.message());
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  arm();
  http::read_header(stream, buffer, parser, ec);
  if (ec) return finish("response head: " + ec.message());
  out.http_status = static_cast<int>(parser.get().result_int());
  if (auto replica = parser.get().find("X-Connex-Replica"); replica != parser.get().end()) {
    out.began_on = std::string(replica->value());
  }
  if (auto retry = parser.get().find(http::field::retry_after); retry != parser.get().end()) {
    out.retry_after = std::string(retry->value());
  }
  serving::OpenAiStreamReader reader;
  while (true) {
    if (out.http_status == 200) {
      std::string& bytes = parser.get().body();
      reader.Feed(bytes);
      bytes.clear();
      if (!TakeEvents(reader, MonotonicNowNs(), &out, on_token)) break;
    }
    if (parser.is_done()) break;
    if (MonotonicNowNs() >= deadline_ns) return finish("no end within the request timeout");
    arm();
    http::read_some(stream, buffer, parser, ec);
    if (ec == http::error::end_of_stream || ec == boost::asio::error::eof) break;
    if (ec == beast::error::timeout) {
      return finish(StrCat("nothing received for ", idle_timeout_ms, " ms"));
    }
    if (ec) return finish("read: " + ec.message());
  }
  if (out.http_status != 200) {
    return finish(StrCat("HTTP ", out.http_status, ": ", parser.get().body().substr(0, 300)));
  }
  if (!reader.done()) return finish("the stream ended without [DONE]");
  if (out.finish_reason.empty()) return finish("the stream ended without a finish_reason");
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return finish("");
}

}  // namespace connex::chaos
