// What the ResumeProxy tests (proxy*_test.cc) share: scripted stage-0 replicas on loopback — each
// FakeReplica is a raw HTTP server that generates a deterministic token per absolute position (so
// a resume that sends the right prompt continues the same sequence), writes its stream with the
// stages' own writer (ChunkBuilder) and can die mid-stream, refuse, fail in-stream or fall silent
// on cue — the readers of what the proxy answered, and the fixture that starts a proxy. The real
// stages are exercised through the proxy by the e2e test. FakeReplica is thread-safe.
#ifndef CONNEX_SERVING_TESTING_FAKE_REPLICA_H_
#define CONNEX_SERVING_TESTING_FAKE_REPLICA_H_

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "connex/serving/openai_stream.h"
#include "connex/serving/proxy.h"
#include "connex/serving/testing/http_client.h"
#include "nlohmann/json.hpp"

namespace connex::serving::testing {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Json = nlohmann::json;

// The token at absolute position `pos` of the fake model: a lower-case letter, its own text.
inline int32_t FakeToken(size_t pos, uint64_t seed) {
  return static_cast<int32_t>('a' + (pos * 7 + seed % 1000) % 26);
}

// A prompt as the fake's token ids: a string is BOS (1) and its bytes, an array is used as is.
inline std::vector<int32_t> FakePrompt(const Json& body) {
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    ids.push_back(1);
    for (const Json& m : body["messages"]) {
      for (char c : m["content"].get<std::string>()) ids.push_back(static_cast<uint8_t>(c));
    }
  } else if (body["prompt"].is_string()) {
    ids.push_back(1);
    for (char c : body["prompt"].get<std::string>()) ids.push_back(static_cast<uint8_t>(c));
  } else {
    ids = body["prompt"].get<std::vector<int32_t>>();
  }
  return ids;
}

class FakeReplica {
 public:
  enum class Act {
    kServe,            // the whole answer
    kDieAfter,         // `n` tokens, then the connection is closed mid-stream
    kStatus,           // an HTTP error `status` with an envelope, before any stream
    kErrorEventAfter,  // `n` tokens, then an in-stream server_error event and [DONE]
    kSilentAfter,      // `n` tokens, then nothing (until the test ends)
    kStopThenDie,      // `n` tokens, the n-th with finish_reason "stop", then the connection
                       // is closed before the usage chunk and [DONE]
    kDieBeforeFinish,  // every token of max_tokens, none with a finish_reason, then the
                       // connection is closed (the finish chunk lost with the replica)
  };
  struct Script {
    Act act = Act::kServe;
    int n = 0;
    int status = 503;
  };

  explicit FakeReplica(int token_delay_ms = 0)
      : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)),
        token_delay_ms_(token_delay_ms) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeReplica() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    // Wakes the blocking accept.
    boost::system::error_code ec;
    tcp::socket poke(io_);
    poke.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port()), ec);
    accept_thread_.join();
    for (std::thread& t : connections_) t.join();
  }

  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  Replica replica(const std::string& name) const {
    return Replica{name, "127.0.0.1:" + std::to_string(port())};
  }
  void Then(Script s) {
    std::lock_guard<std::mutex> lock(mu_);
    scripts_.push_back(s);
  }
  std::vector<std::pair<std::string, Json>> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  // Writes to the proxy that failed: it closed the connection (a cancel).
  int broken_writes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_writes_;
  }

 private:
  void AcceptLoop() {
    while (true) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || ec) return;
      connections_.emplace_back([this, s = std::move(socket)]() mutable { Serve(std::move(s)); });
    }
  }

  bool Write(tcp::socket& s, const std::string& bytes) {
    boost::system::error_code ec;
    asio::write(s, asio::buffer(bytes), ec);
    if (ec) {
      std::lock_guard<std::mutex> lock(mu_);
      ++broken_writes_;
    }
    return !ec;
  }
  bool Chunk(tcp::socket& s, const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return Write(s, size + data + "\r\n");
  }

  void Serve(tcp::socket s) {
    boost::beast::flat_buffer buffer;
    http::request<http::string_body> request;
    boost::system::error_code ec;
    http::read(s, buffer, request, ec);
    if (ec) return;
    Json body = Json::parse(request.body());
    Script script;
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.emplace_back(std::string(request.target()), body);
      if (!scripts_.empty()) {
        script = scripts_.front();
        scripts_.pop_front();
      }
    }
    const Endpoint endpoint =
        std::string(request.target()) == EndpointPath(Endpoint::kChatCompletions)
            ? Endpoint::kChatCompletions
            : Endpoint::kCompletions;
    ChunkBuilder chunks({endpoint, "cmpl-fake", 0, "tiny"}, /*include_usage=*/true);
    if (script.act == Act::kStatus) {
      std::string envelope =
          script.status == 400
              ? R"({"error":{"message":"max_tokens: bad","type":"invalid_request_error","param":"max_tokens","code":"invalid_value"}})"
              : R"({"error":{"message":"the stage is starting","type":"server_error","param":null,"code":null}})";
      Write(s, "HTTP/1.1 " + std::to_string(script.status) +
                   " Error\r\nContent-Type: application/json\r\nConnection: close\r\n"
                   "Content-Length: " +
                   std::to_string(envelope.size()) + "\r\n\r\n" + envelope);
      return;
    }
    const std::vector<int32_t> prompt = FakePrompt(body);
    const int64_t max_tokens = body["max_tokens"].get<int64_t>();
    const uint64_t seed = body.value("seed", uint64_t{0});
    if (!Write(s,
               "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")) {
      return;
    }
    for (int64_t i = 0; i < max_tokens; ++i) {
      if (script.act != Act::kServe && script.act != Act::kDieBeforeFinish && i == script.n) {
        if (script.act == Act::kDieAfter) return;  // the socket closes mid-stream
        if (script.act == Act::kErrorEventAfter) {
          Chunk(s, ChunkBuilder::ErrorEnd(absl::UnavailableError("the pipeline broke")));
          Write(s, "0\r\n\r\n");
          return;
        }
        std::unique_lock<std::mutex> lock(mu_);  // kSilentAfter
        cv_.wait_for(lock, std::chrono::seconds(20), [&] { return stop_; });
        return;
      }
      if (token_delay_ms_ > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(token_delay_ms_));
      const int32_t token = FakeToken(prompt.size() + i, seed);
      const bool stop = script.act == Act::kStopThenDie && i + 1 == script.n;
      std::optional<FinishReason> finish;
      if (i + 1 == max_tokens && script.act != Act::kDieBeforeFinish) {
        finish = FinishReason::kLength;
      }
      if (stop) finish = FinishReason::kStop;
      const std::vector<int32_t> ids = {token};
      if (!Chunk(s, chunks.Delta(std::string(1, static_cast<char>(token)), ids, prompt, finish))) {
        return;
      }
      if (stop) return;  // the socket closes after the last chunk, before [DONE]
    }
    if (script.act == Act::kDieBeforeFinish) return;
    Chunk(s, chunks.End(Usage{static_cast<int64_t>(prompt.size()), max_tokens}));
    Write(s, "0\r\n\r\n");
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  const int token_delay_ms_;
  std::thread accept_thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Script> scripts_;
  std::vector<std::pair<std::string, Json>> requests_;
  std::vector<std::thread> connections_;
  int broken_writes_ = 0;
};

// The SSE events of a streamed body, as JSON ("[DONE]" as the string "[DONE]").
inline std::vector<Json> Events(const std::string& body) {
  std::vector<Json> out;
  SseReader reader;
  reader.Feed(body);
  while (true) {
    absl::StatusOr<std::optional<std::string>> data = reader.Next();
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok() || !*data) break;
    out.push_back(**data == "[DONE]" ? Json("[DONE]") : Json::parse(**data));
  }
  EXPECT_EQ(reader.buffered(), 0u) << "a partial event at the end";
  return out;
}

struct Streamed {
  std::vector<int32_t> tokens;
  std::vector<int32_t> prompt;
  std::string text;
  std::set<std::string> ids;
  std::string finish;
  int done = 0;
  Json usage;
  Json error;
};

inline Streamed Collect(const std::vector<Json>& events) {
  Streamed s;
  for (const Json& e : events) {
    if (e == "[DONE]") {
      ++s.done;
      continue;
    }
    if (e.contains("error")) {
      s.error = e["error"];
      continue;
    }
    s.ids.insert(e["id"].get<std::string>());
    if (e["choices"].empty()) {
      s.usage = e["usage"];
      continue;
    }
    const Json& c = e["choices"][0];
    if (c.contains("text")) s.text += c["text"].get<std::string>();
    if (c.contains("delta") && c["delta"].contains("content")) {
      s.text += c["delta"]["content"].get<std::string>();
    }
    for (const Json& t : c["token_ids"]) s.tokens.push_back(t.get<int32_t>());
    if (c.contains("prompt_token_ids")) {
      EXPECT_TRUE(s.prompt.empty()) << "prompt_token_ids sent twice";
      s.prompt = c["prompt_token_ids"].get<std::vector<int32_t>>();
    }
    if (c["finish_reason"].is_string()) s.finish = c["finish_reason"].get<std::string>();
  }
  return s;
}

inline std::vector<int32_t> Expected(size_t prompt_len, int n, uint64_t seed) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(FakeToken(prompt_len + i, seed));
  return out;
}

inline std::string Text(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) s.push_back(static_cast<char>(t));
  return s;
}

class ResumeProxyTest : public ::testing::Test {
 protected:
  void StartProxy(int64_t retry_budget_ms = 5'000, int max_attempts = 20,
                  int64_t idle_timeout_ms = 10'000, int64_t stream_keepalive_ms = 1'000) {
    ProxyOptions options;
    options.model = "tiny";
    options.retry_budget_ms = retry_budget_ms;
    options.max_attempts = max_attempts;
    options.idle_timeout_ms = idle_timeout_ms;
    options.stream_keepalive_ms = stream_keepalive_ms;
    auto proxy = ResumeProxy::Start(options);
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = *std::move(proxy);
  }
  uint16_t port() const {
    std::string a = proxy_->address();
    return static_cast<uint16_t>(std::stoi(a.substr(a.rfind(':') + 1)));
  }
  // POSTs `body` and reads the whole answer.
  std::optional<testing::Response> Post(const std::string& path, const Json& body) {
    TestConnection c(port(), 20'000);
    if (!c.Send("POST", path, body.dump())) return std::nullopt;
    return c.Read();
  }
  template <typename P>
  bool Eventually(P predicate) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (predicate()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return predicate();
  }

  std::unique_ptr<ResumeProxy> proxy_;
};

inline const Json kStreamRequest = {
    {"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 12},
    {"seed", 5},       {"stream", true},    {"stream_options", {{"include_usage", true}}}};

}  // namespace connex::serving::testing

#endif  // CONNEX_SERVING_TESTING_FAKE_REPLICA_H_
