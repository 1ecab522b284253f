#include "connex/serving/internal/upstream.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>

#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"
#include "connex/base/json_text.h"
#include "connex/base/strings.h"
#include "connex/serving/internal/response_parser.h"
#include "connex/serving/listen_address.h"
#include "nlohmann/json.hpp"

namespace connex::serving::internal {

using Json = nlohmann::json;
namespace asio = boost::asio;
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
  return DumpJson(body);
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
  Json envelope = ParseJson(body);
  if (envelope.is_object() && envelope.contains("error") && envelope["error"].is_object() &&
      envelope["error"].contains("message") && envelope["error"]["message"].is_string()) {
    return envelope["error"]["message"].get<std::string>();
  }
  return body.substr(0, 200);
}

namespace {

// Asio's socket and a timer for the I/O, Beast's parser (sans I/O) for the answer: Beast's
// composed HTTP operations over its timed stream cost most of this file's compile time (22.8 of
// its CPU s) for what a read loop does here.
class AsioUpstreamCall final : public UpstreamCall {
 public:
  AsioUpstreamCall(asio::io_context& io, Replica replica)
      : UpstreamCall(std::move(replica)), socket_(io), timer_(io) {
    // A stream's bytes are consumed as they come, so its length is not bounded here (not
    // boost::none: Beast 1.74 then refuses every body with a Content-Length).
    parser_.body_limit(std::numeric_limits<uint64_t>::max());
    parser_.header_limit(16 * 1024);
  }

  void Start(UpstreamRequest request, Timeouts timeouts, Callbacks callbacks) override {
    timeouts_ = timeouts;
    callbacks_ = std::move(callbacks);
    request_ = StrCat("POST ", request.target, " HTTP/1.1\r\nHost: ", replica().http_address,
                      "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
                      "Content-Length: ",
                      request.body.size(), "\r\n\r\n", request.body);
    HttpServerOptions parsed;
    absl::Status address = ParseListenAddress("http", replica().http_address, &parsed);
    boost::system::error_code ec;
    asio::ip::address ip = asio::ip::make_address(parsed.host, ec);
    if (!address.ok() || ec || parsed.port == 0) {
      return Fail(
          StrCat("its API address ", replica().http_address, " is not a numeric HOST:PORT"));
    }
    Arm(timeouts_.connect_ms);
    socket_.async_connect(tcp::endpoint(ip, parsed.port),
                          [this, self = Self()](boost::system::error_code ec) {
                            Disarm();
                            if (closed_) return;
                            if (ec) return Fail(StrCat("connect: ", Why(ec)), /*connect=*/true);
                            callbacks_.on_connected(self);
                            if (closed_) return;
                            boost::system::error_code nodelay_ec;  // out at once, not behind Nagle
                            socket_.set_option(tcp::no_delay(true), nodelay_ec);
                            Send();
                          });
  }

  void Close() override {
    if (closed_) return;
    closed_ = true;
    Disarm();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  bool closed() const override { return closed_; }

 private:
  Ptr Self() { return shared_from_this(); }

  // The next operation ends by `ms` from now: the timer closes the socket, which ends it with
  // an error that Why reports as the timeout.
  void Arm(int64_t ms) {
    timed_out_ = false;
    const uint64_t armed = ++timer_generation_;
    timer_.expires_after(std::chrono::milliseconds(ms));
    timer_.async_wait([this, self = Self(), armed](boost::system::error_code ec) {
      if (ec || closed_ || armed != timer_generation_) return;  // cancelled, or re-armed since
      timed_out_ = true;
      boost::system::error_code ignored;
      socket_.close(ignored);
    });
  }
  void Disarm() {
    ++timer_generation_;
    timer_.cancel();
  }
  std::string Why(const boost::system::error_code& ec) const {
    return timed_out_ ? "timed out" : ec.message();
  }

  void Send() {
    Arm(timeouts_.idle_ms);
    asio::async_write(socket_, asio::buffer(request_),
                      [this, self = Self()](boost::system::error_code ec, size_t) {
                        Disarm();
                        if (closed_) return;
                        if (ec) return Fail(StrCat("sending the request: ", Why(ec)));
                        Read();
                      });
  }

  void Read() {
    Arm(timeouts_.idle_ms);
    socket_.async_read_some(
        asio::buffer(buffer_), [this, self = Self()](boost::system::error_code ec, size_t n) {
          Disarm();
          if (closed_) return;
          input_.append(buffer_.data(), n);
          const bool eof = ec == asio::error::eof;
          if (ec && !eof) {
            return Fail(StrCat(head_ ? "the stream broke: " : "reading the answer: ", Why(ec)));
          }
          if (!Parse(eof)) return;  // failed, or over
          Read();
        });
  }

  // Feeds what came to the parser and hands on what it makes whole. False when the call is over
  // (ended, failed or closed).
  bool Parse(bool eof) {
    if (absl::Status fed = FeedResponseParser(parser_, input_, eof); !fed.ok()) {
      Fail(StrCat(head_ ? "the stream broke: " : "reading the answer: ", fed.message()));
      return false;
    }
    if (!head_ && parser_.is_header_done()) {
      head_ = true;
      streaming_ = parser_.get().result_int() == 200;
    }
    if (head_) {
      std::string& body = parser_.get().body();
      if (streaming_) {
        events_.Feed(body);
        body.clear();
        if (!TakeEvents()) return false;
      } else if (body.size() > kMaxUpstreamMessageBytes) {
        Fail("an error body over 1 MiB");
        return false;
      }
    }
    if (parser_.is_done()) {
      Ended();
      return false;
    }
    if (eof) {
      Fail(head_ ? "the stream broke: the connection ended"
                 : "reading the answer: the connection "
                   "ended before its head");
      return false;
    }
    return true;
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

  tcp::socket socket_;
  asio::steady_timer timer_;
  uint64_t timer_generation_ = 0;
  bool timed_out_ = false;
  std::string request_;
  std::array<char, 16384> buffer_;
  std::string input_;  // received, not yet parsed
  ResponseParser parser_;
  OpenAiStreamReader events_;  // a 200 answer's
  Timeouts timeouts_;
  Callbacks callbacks_;
  bool head_ = false;
  bool streaming_ = false;
  bool closed_ = false;  // late completions are ignored
};

}  // namespace

UpstreamCall::Ptr UpstreamCall::Create(asio::io_context& io, Replica replica) {
  return std::make_shared<AsioUpstreamCall>(io, std::move(replica));
}

}  // namespace connex::serving::internal
