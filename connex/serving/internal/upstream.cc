#include "connex/serving/internal/upstream.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "connex/base/strings.h"
#include "connex/serving/listen_address.h"
#include "nlohmann/json.hpp"

namespace connex::serving::internal {

using Json = nlohmann::json;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string UpstreamBody(const CompletionRequest& r, std::span<const int32_t> resume_prompt,
                         int64_t max_tokens) {
  Json body = Json::object();
  body["model"] = r.model;
  if (!resume_prompt.empty()) {
    body["prompt"] = std::vector<int32_t>(resume_prompt.begin(), resume_prompt.end());
  } else if (r.endpoint == Endpoint::kChatCompletions) {
    Json messages = Json::array();
    for (const ChatMessage& m : r.messages) {
      messages.push_back({{"role", m.role}, {"content", m.content}});
    }
    body["messages"] = std::move(messages);
  } else if (r.prompt_text) {
    body["prompt"] = *r.prompt_text;
  } else {
    body["prompt"] = r.prompt_token_ids;
  }
  body["max_tokens"] = max_tokens;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (!r.stop.empty()) body["stop"] = r.stop;
  if (r.seed) body["seed"] = *r.seed;
  // The sampling fields the client gave, and only those: the replica fills the others with its
  // defaults (the model's generation_config.json, --generation-config), as it would have for the
  // client. They go with every attempt: a resume continues under the same rules (the penalty's
  // tokens, prompt + output, are the resumed prompt's).
  if (r.temperature) body["temperature"] = *r.temperature;
  if (r.top_p) body["top_p"] = *r.top_p;
  if (r.top_k) body["top_k"] = *r.top_k;
  if (r.min_p) body["min_p"] = *r.min_p;
  if (r.repetition_penalty) body["repetition_penalty"] = *r.repetition_penalty;
  if (r.ignore_eos) body["ignore_eos"] = true;
  if (!r.stop_token_ids.empty()) body["stop_token_ids"] = r.stop_token_ids;
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

UpstreamRequest MakeUpstreamRequest(const CompletionRequest& r, std::span<const int32_t> prompt,
                                    std::span<const int32_t> delivered, int64_t max_tokens) {
  if (delivered.empty()) {
    return {std::string(EndpointPath(r.endpoint)), UpstreamBody(r, {}, max_tokens)};
  }
  std::vector<int32_t> resume(prompt.begin(), prompt.end());
  resume.insert(resume.end(), delivered.begin(), delivered.end());
  return {std::string(EndpointPath(Endpoint::kCompletions)), UpstreamBody(r, resume, max_tokens)};
}

std::string ErrorMessageOf(const std::string& body) {
  Json envelope = Json::parse(body, nullptr, false);
  if (envelope.is_object() && envelope.contains("error") && envelope["error"].is_object() &&
      envelope["error"].contains("message") && envelope["error"]["message"].is_string()) {
    return envelope["error"]["message"].get<std::string>();
  }
  return body.substr(0, 200);
}

namespace {

class BeastUpstreamCall final : public UpstreamCall {
 public:
  BeastUpstreamCall(asio::io_context& io, Replica replica)
      : UpstreamCall(std::move(replica)), stream_(io) {}

  void Start(UpstreamRequest request, Timeouts timeouts, Callbacks callbacks) override {
    timeouts_ = timeouts;
    callbacks_ = std::move(callbacks);
    request_.method(http::verb::post);
    request_.target(request.target);
    request_.version(11);
    request_.set(http::field::host, replica().http_address);
    request_.set(http::field::content_type, "application/json");
    request_.set(http::field::accept, "text/event-stream");
    request_.body() = std::move(request.body);
    request_.prepare_payload();
    // A stream's bytes are consumed as they come, so its length is not bounded here (not
    // boost::none: Beast 1.74 then refuses every body with a Content-Length).
    parser_.body_limit(std::numeric_limits<uint64_t>::max());
    parser_.header_limit(16 * 1024);

    HttpServerOptions parsed;
    absl::Status address = ParseListenAddress("http", replica().http_address, &parsed);
    boost::system::error_code ec;
    asio::ip::address ip = asio::ip::make_address(parsed.host, ec);
    if (!address.ok() || ec || parsed.port == 0) {
      return Fail(
          StrCat("its API address ", replica().http_address, " is not a numeric HOST:PORT"));
    }
    auto self = Self();
    stream_.expires_after(std::chrono::milliseconds(timeouts_.connect_ms));
    stream_.async_connect(tcp::endpoint(ip, parsed.port), [this, self](beast::error_code ec) {
      if (closed_) return;
      if (ec) return Fail(StrCat("connect: ", ec.message()), /*connect=*/true);
      callbacks_.on_connected(self);
      if (closed_) return;
      beast::error_code nodelay_ec;  // the request goes out at once, not behind Nagle
      stream_.socket().set_option(tcp::no_delay(true), nodelay_ec);
      stream_.expires_after(std::chrono::milliseconds(timeouts_.idle_ms));
      http::async_write(stream_, request_, [this, self](beast::error_code ec, size_t) {
        if (closed_) return;
        if (ec) return Fail(StrCat("sending the request: ", ec.message()));
        stream_.expires_after(std::chrono::milliseconds(timeouts_.idle_ms));
        http::async_read_header(stream_, buffer_, parser_,
                                [this, self](beast::error_code ec, size_t) {
                                  if (closed_) return;
                                  if (ec) return Fail(StrCat("reading the answer: ", ec.message()));
                                  streaming_ = parser_.get().result_int() == 200;
                                  Read();
                                });
      });
    });
  }

  void Close() override {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  bool closed() const override { return closed_; }

 private:
  Ptr Self() { return shared_from_this(); }

  void Read() {
    if (parser_.is_done()) return Ended();
    stream_.expires_after(std::chrono::milliseconds(timeouts_.idle_ms));
    http::async_read_some(stream_, buffer_, parser_,
                          [this, self = Self()](beast::error_code ec, size_t) {
                            if (closed_) return;
                            std::string& body = parser_.get().body();
                            if (streaming_) {
                              events_.Feed(body);
                              body.clear();
                              if (!TakeEvents()) return;  // the call is over
                            } else if (body.size() > kMaxUpstreamMessageBytes) {
                              return Fail("an error body over 1 MiB");
                            }
                            if (parser_.is_done()) return Ended();
                            if (ec) return Fail(StrCat("the stream broke: ", ec.message()));
                            Read();
                          });
  }

  // Hands over each event streamed whole so far. False when the call is over.
  bool TakeEvents() {
    while (!closed_) {
      absl::StatusOr<std::optional<StreamEvent>> event = events_.Next();
      if (!event.ok()) {
        Fail(std::string(event.status().message()));
        return false;
      }
      if (!*event) return true;
      callbacks_.on_event(Self(), **event);
    }
    return false;
  }

  void Ended() {
    callbacks_.on_ended(Self(), parser_.get().result_int(),
                        streaming_ ? std::string() : std::move(parser_.get().body()));
  }

  void Fail(std::string why, bool connect = false) {
    if (closed_) return;
    callbacks_.on_failed(Self(), std::move(why), connect);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response_parser<http::string_body> parser_;
  OpenAiStreamReader events_;  // a 200 answer's
  Timeouts timeouts_;
  Callbacks callbacks_;
  bool streaming_ = false;
  bool closed_ = false;  // late completions are ignored
};

}  // namespace

UpstreamCall::Ptr UpstreamCall::Create(asio::io_context& io, Replica replica) {
  return std::make_shared<BeastUpstreamCall>(io, std::move(replica));
}

}  // namespace connex::serving::internal
