// ResumeProxy against scripted stage-0 replicas on loopback: each fake replica is a raw HTTP
// server that generates a deterministic token per absolute position (so a resume that sends the
// right prompt continues the same sequence) and can die mid-stream, refuse, fail in-stream or
// fall silent on cue. The real stages are exercised through the proxy by the e2e test.
#include "connex/serving/proxy.h"

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
#include "connex/serving/testing/http_client.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Json = nlohmann::json;
using testing::TestConnection;

// The token at absolute position `pos` of the fake model: a lower-case letter, its own text.
int32_t FakeToken(size_t pos, uint64_t seed) {
  return static_cast<int32_t>('a' + (pos * 7 + seed % 1000) % 26);
}

// A prompt as the fake's token ids: a string is BOS (1) and its bytes, an array is used as is.
std::vector<int32_t> FakePrompt(const Json& body) {
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
  bool Event(tcp::socket& s, const std::string& json) { return Chunk(s, "data: " + json + "\n\n"); }

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
      if (script.act != Act::kServe && i == script.n) {
        if (script.act == Act::kDieAfter) return;  // the socket closes mid-stream
        if (script.act == Act::kErrorEventAfter) {
          Event(
              s,
              R"({"error":{"message":"the pipeline broke","type":"server_error","param":null,"code":null}})");
          Event(s, "[DONE]");
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
      Json finish = stop ? Json("stop") : i + 1 == max_tokens ? Json("length") : Json(nullptr);
      Json choice = {{"index", 0},
                     {"text", std::string(1, static_cast<char>(token))},
                     {"token_ids", {token}},
                     {"finish_reason", finish}};
      if (i == 0) choice["prompt_token_ids"] = prompt;
      Json chunk = {{"id", "cmpl-fake"}, {"object", "text_completion"}, {"choices", {choice}}};
      if (!Event(s, chunk.dump())) return;
      if (stop) return;  // the socket closes after the last chunk, before [DONE]
    }
    Json usage = {{"id", "cmpl-fake"},
                  {"choices", Json::array()},
                  {"usage", {{"prompt_tokens", prompt.size()}, {"completion_tokens", max_tokens}}}};
    Event(s, usage.dump());
    Event(s, "[DONE]");
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
std::vector<Json> Events(const std::string& body) {
  std::vector<Json> out;
  size_t start = 0;
  while (true) {
    size_t end = body.find("\n\n", start);
    if (end == std::string::npos) break;
    std::string event = body.substr(start, end - start);
    start = end + 2;
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    std::string data = event.substr(6);
    out.push_back(data == "[DONE]" ? Json("[DONE]") : Json::parse(data));
  }
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

Streamed Collect(const std::vector<Json>& events) {
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

std::vector<int32_t> Expected(size_t prompt_len, int n, uint64_t seed) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(FakeToken(prompt_len + i, seed));
  return out;
}

std::string Text(const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens) s.push_back(static_cast<char>(t));
  return s;
}

class ResumeProxyTest : public ::testing::Test {
 protected:
  void StartProxy(int64_t retry_budget_ms = 5'000, int max_attempts = 20,
                  int64_t idle_timeout_ms = 10'000) {
    ProxyOptions options;
    options.model = "tiny";
    options.retry_budget_ms = retry_budget_ms;
    options.max_attempts = max_attempts;
    options.idle_timeout_ms = idle_timeout_ms;
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

const Json kStreamRequest = {{"model", "tiny"},  {"prompt", "hello"},
                             {"max_tokens", 12}, {"seed", 5},
                             {"stream", true},   {"stream_options", {{"include_usage", true}}}};

TEST_F(ResumeProxyTest, StreamsAnUndisturbedAnswerFromOneReplica) {
  FakeReplica a;
  StartProxy();
  proxy_->SetReplicas({a.replica("a")});
  auto r = Post("/v1/completions", kStreamRequest);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 200);
  EXPECT_EQ((*r)[std::string(kReplicaHeader)], "a") << "the replica the answer began on";
  Streamed s = Collect(Events(r->body()));
  EXPECT_EQ(s.tokens, Expected(6, 12, 5));
  EXPECT_EQ(s.text, Text(s.tokens));
  EXPECT_EQ(s.prompt.size(), 6u);
  EXPECT_EQ(s.finish, "length");
  EXPECT_EQ(s.done, 1);
  EXPECT_EQ(s.ids.size(), 1u);
  EXPECT_EQ(s.usage["completion_tokens"], 12);
  EXPECT_EQ(s.usage["prompt_tokens"], 6);
  ASSERT_EQ(a.requests().size(), 1u);
  EXPECT_EQ(a.requests()[0].second["stream"], true);  // upstream attempts always stream
  EXPECT_EQ(proxy_->stats().attempts, 1);
  EXPECT_EQ(proxy_->stats().completed, 1);
}

TEST_F(ResumeProxyTest, AReplicaThatDiesMidStreamIsResumedElsewhereWithoutADuplicate) {
  FakeReplica a, b;
  a.Then({FakeReplica::Act::kDieAfter, 4});
  b.Then({FakeReplica::Act::kDieAfter, 3});  // and the second one dies too
  StartProxy();
  proxy_->SetReplicas({a.replica("a"), b.replica("b")});
  auto r = Post("/v1/completions", kStreamRequest);
  ASSERT_TRUE(r);
  Streamed s = Collect(Events(r->body()));
  EXPECT_EQ(s.tokens, Expected(6, 12, 5));
  EXPECT_EQ(s.text, Text(s.tokens));
  EXPECT_EQ(s.done, 1);
  EXPECT_EQ(s.ids.size(), 1u) << "one response id across the resumes";
  EXPECT_EQ(s.usage["completion_tokens"], 12);
  EXPECT_EQ(s.usage["prompt_tokens"], 6);
  // The resumes sent the prompt's ids plus those delivered, and what was left of max_tokens.
  std::vector<std::pair<std::string, Json>> all = a.requests();
  for (auto& req : b.requests()) all.push_back(req);
  ASSERT_EQ(all.size(), 3u);
  int resumed = 0;
  for (const auto& [target, body] : all) {
    if (body["prompt"].is_string()) continue;
    ++resumed;
    EXPECT_EQ(target, "/v1/completions");
    const size_t delivered = body["prompt"].size() - 6;
    EXPECT_TRUE(delivered == 4 || delivered == 7) << body.dump();
    EXPECT_EQ(body["max_tokens"], 12 - static_cast<int>(delivered));
    EXPECT_EQ(body["seed"], 5);
  }
  EXPECT_EQ(resumed, 2);
  EXPECT_EQ(proxy_->stats().resumes, 2);
  EXPECT_EQ(proxy_->stats().completed, 1);
}

// The chunk with finish_reason reached the client, then the replica's connection broke before
// [DONE]: the answer is whole. A resume would put the EOS into the prompt and stream tokens after
// finish_reason "stop".
TEST_F(ResumeProxyTest, AStreamThatBreaksAfterItsLastChunkIsCompletedNotResumed) {
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streaming" : "non-streaming");
    FakeReplica a, b;
    a.Then({FakeReplica::Act::kStopThenDie, 5});
    b.Then({FakeReplica::Act::kStopThenDie, 5});
    StartProxy();
    proxy_->SetReplicas({a.replica("a"), b.replica("b")});
    Json request = kStreamRequest;
    request["stream"] = stream;
    if (!stream) request.erase("stream_options");
    auto r = Post("/v1/completions", request);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->result_int(), 200) << r->body();
    std::vector<int32_t> tokens;
    std::string finish;
    if (stream) {
      Streamed s = Collect(Events(r->body()));
      tokens = s.tokens;
      finish = s.finish;
      EXPECT_EQ(s.done, 1);
      EXPECT_EQ(s.usage["completion_tokens"], 5);
      EXPECT_TRUE(s.error.is_null()) << s.error.dump();
    } else {
      Json body = Json::parse(r->body());
      tokens = body["choices"][0]["token_ids"].get<std::vector<int32_t>>();
      finish = body["choices"][0]["finish_reason"].get<std::string>();
    }
    EXPECT_EQ(tokens, Expected(6, 5, 5)) << "nothing after the finishing token";
    EXPECT_EQ(finish, "stop");
    EXPECT_EQ(a.requests().size() + b.requests().size(), 1u) << "no resume of a finished answer";
    EXPECT_EQ(proxy_->stats().resumes, 0);
    EXPECT_EQ(proxy_->stats().completed, 1);
    proxy_.reset();
  }
}

TEST_F(ResumeProxyTest, ANonStreamingRequestIsResumedIntoOneWholeAnswer) {
  FakeReplica a, b;
  a.Then({FakeReplica::Act::kErrorEventAfter, 5});  // an in-stream server error is retried
  StartProxy();
  proxy_->SetReplicas({a.replica("a"), b.replica("b")});
  Json request = {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 9}, {"seed", 2}};
  auto r = Post("/v1/completions", request);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->result_int(), 200) << r->body();
  Json body = Json::parse(r->body());
  EXPECT_EQ(body["object"], "text_completion");
  const Json& c = body["choices"][0];
  std::vector<int32_t> tokens = c["token_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(tokens, Expected(3, 9, 2));
  EXPECT_EQ(c["text"], Text(tokens));
  EXPECT_EQ(c["prompt_token_ids"].size(), 3u);
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 9);
}

TEST_F(ResumeProxyTest, ARequestWithoutASeedGetsOneThatEveryAttemptShares) {
  FakeReplica a, b;
  a.Then({FakeReplica::Act::kDieAfter, 2});
  StartProxy();
  proxy_->SetReplicas({a.replica("a"), b.replica("b")});
  Json request = kStreamRequest;
  request.erase("seed");
  request["temperature"] = 0.8;
  auto r = Post("/v1/completions", request);
  ASSERT_TRUE(r);
  ASSERT_EQ(a.requests().size() + b.requests().size(), 2u);
  std::vector<Json> bodies;
  for (auto& req : a.requests()) bodies.push_back(req.second);
  for (auto& req : b.requests()) bodies.push_back(req.second);
  ASSERT_TRUE(bodies[0].contains("seed"));
  EXPECT_EQ(bodies[0]["seed"], bodies[1]["seed"]);
  EXPECT_EQ(bodies[0]["temperature"], 0.8);
  Streamed s = Collect(Events(r->body()));
  EXPECT_EQ(s.tokens, Expected(6, 12, bodies[0]["seed"].get<uint64_t>()));
}

TEST_F(ResumeProxyTest, AChatRequestResumesFromTokenIdsAndStaysAChatStream) {
  FakeReplica a, b;
  a.Then({FakeReplica::Act::kDieAfter, 3});
  StartProxy();
  proxy_->SetReplicas({a.replica("a"), b.replica("b")});
  Json request = {{"model", "tiny"},
                  {"messages", {{{"role", "user"}, {"content", "hey"}}}},
                  {"max_tokens", 8},
                  {"seed", 1},
                  {"stream", true}};
  auto r = Post("/v1/chat/completions", request);
  ASSERT_TRUE(r);
  std::vector<Json> events = Events(r->body());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  Streamed s = Collect(events);
  EXPECT_EQ(s.tokens, Expected(4, 8, 1));
  EXPECT_EQ(s.text, Text(s.tokens));
  auto all = a.requests();
  for (auto& req : b.requests()) all.push_back(req);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, "/v1/chat/completions");
  EXPECT_EQ(all[1].first, "/v1/completions");
}

TEST_F(ResumeProxyTest, TheOnlyReplicaRestartingIsWaitedForWithinTheBudget) {
  FakeReplica a;
  a.Then({FakeReplica::Act::kDieAfter, 3});
  a.Then({FakeReplica::Act::kStatus, 0, 503});  // "starting"
  StartProxy(/*retry_budget_ms=*/10'000);
  proxy_->SetReplicas({a.replica("a@1")});
  std::optional<testing::Response> r;
  std::thread client([&] { r = Post("/v1/completions", kStreamRequest); });
  // The replica leaves the directory (dead), then comes back under a new epoch.
  ASSERT_TRUE(Eventually([&] { return proxy_->stats().retries >= 1; }));
  proxy_->SetReplicas({});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // an outage, not a condition
  proxy_->SetReplicas({a.replica("a@2")});
  client.join();
  ASSERT_TRUE(r);
  Streamed s = Collect(Events(r->body()));
  EXPECT_EQ(s.tokens, Expected(6, 12, 5));
  EXPECT_EQ(s.done, 1);
  EXPECT_EQ(a.requests().size(), 3u);
}

TEST_F(ResumeProxyTest, AnOutageLongerThanTheBudgetEndsWithAnErrorNamingTheModel) {
  StartProxy(/*retry_budget_ms=*/300);
  Json request = kStreamRequest;
  request["stream"] = false;
  request.erase("stream_options");
  auto r = Post("/v1/completions", request);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 503);
  Json body = Json::parse(r->body());
  EXPECT_NE(body["error"]["message"].get<std::string>().find("tiny"), std::string::npos)
      << r->body();
  EXPECT_EQ(body["error"]["type"], "server_error");
  EXPECT_EQ(proxy_->stats().failed, 1);
}

TEST_F(ResumeProxyTest, AStreamCutAfterTokensEndsWithAnErrorEventWhenTheBudgetRunsOut) {
  FakeReplica a;
  a.Then({FakeReplica::Act::kDieAfter, 3});
  for (int i = 0; i < 5; ++i) a.Then({FakeReplica::Act::kStatus, 0, 503});
  StartProxy(/*retry_budget_ms=*/10'000, /*max_attempts=*/4);
  proxy_->SetReplicas({a.replica("a")});
  auto r = Post("/v1/completions", kStreamRequest);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 200);  // the stream had started
  Streamed s = Collect(Events(r->body()));
  EXPECT_EQ(s.tokens, Expected(6, 3, 5));
  ASSERT_TRUE(s.error.is_object());
  EXPECT_NE(s.error["message"].get<std::string>().find("4 attempts"), std::string::npos)
      << s.error.dump();
  EXPECT_EQ(s.done, 1);
  EXPECT_EQ(a.requests().size(), 4u);
}

TEST_F(ResumeProxyTest, AReplicaSilentPastTheIdleTimeoutIsTakenAsDead) {
  FakeReplica a, b;
  a.Then({FakeReplica::Act::kSilentAfter, 2});
  StartProxy(/*retry_budget_ms=*/5'000, /*max_attempts=*/20, /*idle_timeout_ms=*/300);
  proxy_->SetReplicas({a.replica("a"), b.replica("b")});
  auto r = Post("/v1/completions", kStreamRequest);
  ASSERT_TRUE(r);
  Streamed s = Collect(Events(r->body()));
  EXPECT_EQ(s.tokens, Expected(6, 12, 5));
  EXPECT_EQ(proxy_->stats().resumes, 1);
}

TEST_F(ResumeProxyTest, AReplicasRefusalIsTheClientsAnswer) {
  FakeReplica a;
  a.Then({FakeReplica::Act::kStatus, 0, 400});
  StartProxy();
  proxy_->SetReplicas({a.replica("a")});
  auto r = Post("/v1/completions", kStreamRequest);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 400);
  Json body = Json::parse(r->body());
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_EQ(a.requests().size(), 1u) << "a 4xx is not retried";
}

TEST_F(ResumeProxyTest, BadInputIsRefusedByTheProxyItself) {
  FakeReplica a;
  StartProxy();
  proxy_->SetReplicas({a.replica("a")});
  {
    TestConnection c(port());
    ASSERT_TRUE(c.Send("POST", "/v1/completions", "{not json"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->result_int(), 400);
  }
  Json other = kStreamRequest;
  other["model"] = "other";
  auto r = Post("/v1/completions", other);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 404);
  Json wrong = kStreamRequest;
  wrong["max_tokens"] = "many";
  r = Post("/v1/completions", wrong);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 400);
  EXPECT_EQ(Json::parse(r->body())["error"]["param"], "max_tokens");
  EXPECT_TRUE(a.requests().empty());
}

TEST_F(ResumeProxyTest, AClientThatGoesAwayCancelsAndIsNotRetried) {
  FakeReplica a(/*token_delay_ms=*/20);
  StartProxy();
  proxy_->SetReplicas({a.replica("a")});
  Json request = kStreamRequest;
  request["max_tokens"] = 500;
  {
    TestConnection c(port());
    ASSERT_TRUE(c.Send("POST", "/v1/completions", request.dump()));
    ASSERT_TRUE(c.ReadHead());
    ASSERT_TRUE(c.ReadUntil("token_ids"));
    c.Close();
  }
  ASSERT_TRUE(Eventually([&] { return proxy_->stats().cancelled == 1; }));
  // The proxy closed its upstream connection: the replica's next write fails.
  EXPECT_TRUE(Eventually([&] { return a.broken_writes() >= 1; }));
  EXPECT_EQ(a.requests().size(), 1u);
  EXPECT_EQ(proxy_->stats().retries, 0);
}

TEST_F(ResumeProxyTest, HealthAndModelsFollowTheReplicaSet) {
  StartProxy();
  {
    TestConnection c(port());
    ASSERT_TRUE(c.Send("GET", "/health"));
    auto r = c.Read();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->result_int(), 503);
  }
  FakeReplica a;
  proxy_->SetReplicas({a.replica("a")});
  TestConnection c(port());
  ASSERT_TRUE(c.Send("GET", "/health"));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 200);
  ASSERT_TRUE(c.Send("GET", "/v1/models"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(Json::parse(r->body())["data"][0]["id"], "tiny");
  ASSERT_TRUE(c.Send("GET", "/metrics"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_NE(r->body().find("connex_proxy_resumes_total"), std::string::npos);
  EXPECT_NE(r->body().find("connex_proxy_replicas 1"), std::string::npos) << r->body();
}

// The proxy's /health used to say 200 while a stage of the model had no live replica (every
// request then waited and failed): it is 503 naming the missing stage.
TEST_F(ResumeProxyTest, HealthIs503NamingAMissingStage) {
  FakeReplica a;
  StartProxy();
  proxy_->SetReplicas({a.replica("a")});
  proxy_->SetChainProblem("no live replica of stage 2 (of 4)");
  TestConnection c(port());
  ASSERT_TRUE(c.Send("GET", "/health"));
  auto r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 503);
  EXPECT_NE(r->body().find("no live replica of stage 2"), std::string::npos) << r->body();
  proxy_->SetChainProblem("");
  ASSERT_TRUE(c.Send("GET", "/health"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 200);
}

TEST(ChainProblemTest, NamesTheStagesWithoutALiveReplica) {
  auto record = [](uint32_t stage, uint32_t replica) {
    directory::Record r;
    r.lid = Lid{"tiny", stage, 0, replica};
    r.metadata["stages"] = "3";
    return r;
  };
  std::vector<directory::Record> view = {record(0, 0), record(1, 0), record(2, 0), record(0, 1),
                                         record(2, 1)};
  EXPECT_EQ(ChainProblem(view, "tiny"), "");  // stage 1 of r1 is served by r0's
  view.erase(view.begin() + 1);               // no stage 1 at all
  EXPECT_EQ(ChainProblem(view, "tiny"), "no live replica of stage 1 (of 3)");
  EXPECT_EQ(ChainProblem(view, "other"), "");
}

TEST(ProxyOptionsTest, BadOptionsAreNamed) {
  ProxyOptions options;
  EXPECT_NE(options.Validate().message().find("--model"), std::string_view::npos);
  options.model = "tiny";
  EXPECT_TRUE(options.Validate().ok());
  options.max_attempts = 0;
  EXPECT_NE(options.Validate().message().find("attempts"), std::string_view::npos);
}

TEST(StageZeroReplicasTest, OnlyStageZeroRecordsOfTheModelWithAnApi) {
  std::vector<directory::Record> view(4);
  view[0].lid = Lid{"tiny", 0, 0, 0};
  view[0].epoch = 3;
  view[0].metadata["http"] = "127.0.0.1:9000";
  view[1].lid = Lid{"tiny", 1, 0, 0};  // stage 1
  view[1].metadata["http"] = "127.0.0.1:9001";
  view[2].lid = Lid{"tiny", 0, 0, 1};  // no API
  view[3].lid = Lid{"other", 0, 0, 0};
  view[3].metadata["http"] = "127.0.0.1:9003";
  std::vector<Replica> r = StageZeroReplicas(view, "tiny");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].http_address, "127.0.0.1:9000");
  EXPECT_EQ(r[0].name, "tiny/g0/s0/r0@3");
}

}  // namespace
}  // namespace connex::serving
