#include "connex/serving/http_server.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "connex/base/mutex.h"
#include "connex/base/wait.h"
#include "connex/serving/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using ::testing::HasSubstr;
using testing::Response;
using testing::TestConnection;

constexpr int64_t kDeadlineMs = 10'000;

// Echoes "METHOD PATH BODY" with 200.
void Echo(std::shared_ptr<HttpExchange> exchange) {
  const HttpRequest& r = exchange->request();
  exchange->Respond(HttpResponse{200, "text/plain", r.method + " " + r.path + " " + r.body, {}});
}

std::unique_ptr<HttpServer> Start(HttpServerOptions options, HttpHandler handler) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      StartHttpServer(options, std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

// The OpenAI error code of an error response.
std::string ErrorCodeOf(const Response& response) {
  return nlohmann::json::parse(response.body())["error"]["code"].get<std::string>();
}

bool CanConnect(uint16_t port) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  return !ec;
}

// Exchanges a handler keeps, for a test to answer later.
class Parked {
 public:
  HttpHandler Handler() {
    return [this](std::shared_ptr<HttpExchange> exchange) {
      MutexLock lock(&mu_);
      exchanges_.push_back(std::move(exchange));
    };
  }
  size_t size() {
    MutexLock lock(&mu_);
    return exchanges_.size();
  }
  std::vector<std::shared_ptr<HttpExchange>> Take() {
    MutexLock lock(&mu_);
    return std::move(exchanges_);
  }

 private:
  Mutex mu_;
  std::vector<std::shared_ptr<HttpExchange>> exchanges_ ABSL_GUARDED_BY(mu_);
};

// The server still answers a fresh connection (through `parked` when the handler parks).
void ExpectServing(HttpServer& server, Parked* parked = nullptr) {
  TestConnection c(server.port());
  ASSERT_TRUE(c.Send("GET", "/still"));
  if (parked != nullptr) {
    ASSERT_TRUE(WaitUntil([&] { return parked->size() == 1; }, kDeadlineMs));
    parked->Take()[0]->Respond(HttpResponse{200, "text/plain", "ok", {}});
  }
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 200u);
}

TEST(HttpServerTest, ServesOnAFreePortWithKeepAlive) {
  std::unique_ptr<HttpServer> server = Start({}, Echo);
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
  TestConnection c(server->port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.Send("POST", "/v1/echo?x=1", "body" + std::to_string(i)));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->result_int(), 200u);
    EXPECT_EQ(r->body(), "POST /v1/echo body" + std::to_string(i));
    EXPECT_TRUE(r->keep_alive());
  }
  EXPECT_EQ(server->stats().requests, 3);
  EXPECT_EQ(server->stats().accepted_connections, 1);
}

TEST(HttpServerTest, HeadersReachTheHandler) {
  std::unique_ptr<HttpServer> server = Start({}, [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(HttpResponse{201, "text/plain",
                                   std::string(exchange->request().Header("x-CUSTOM")),
                                   {{"X-Reply", "yes"}}});
  });
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("GET", "/", "", "X-Custom: hello\r\n"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 201u);
  EXPECT_EQ(r->body(), "hello");
  EXPECT_EQ((*r)["X-Reply"], "yes");
}

TEST(HttpServerTest, StreamsChunksAsTheyAreProduced) {
  Parked parked;
  std::unique_ptr<HttpServer> server = Start({}, parked.Handler());
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("POST", "/v1/completions", "{}"));
  ASSERT_TRUE(WaitUntil([&] { return parked.size() == 1; }, kDeadlineMs));
  std::shared_ptr<HttpExchange> exchange = parked.Take()[0];
  ASSERT_TRUE(exchange->StartStream());
  ASSERT_TRUE(exchange->Send("data: one\n\n"));
  ASSERT_TRUE(c.ReadHead());
  EXPECT_EQ(c.parser().get()[testing::http::field::content_type], "text/event-stream");
  EXPECT_TRUE(c.parser().chunked());
  // The second chunk is produced only after the client has seen the first.
  ASSERT_TRUE(c.ReadUntil("data: one\n\n"));
  ASSERT_TRUE(exchange->Send("data: two\n\n"));
  ASSERT_TRUE(c.ReadUntil("data: two\n\n"));
  exchange->EndStream();
  EXPECT_FALSE(exchange->Send("late"));
  ASSERT_TRUE(c.ReadToEnd());
  EXPECT_EQ(c.parser().get().body(), "data: one\n\ndata: two\n\n");
  EXPECT_FALSE(exchange->cancelled());
  // The connection serves its next request after the stream.
  ASSERT_TRUE(c.Send("GET", "/next"));
  ASSERT_TRUE(WaitUntil([&] { return parked.size() == 1; }, kDeadlineMs));
  EXPECT_EQ(parked.Take()[0]->request().path, "/next");
}

TEST(HttpServerTest, MalformedRequestsGet400AndTheServerGoesOn) {
  std::unique_ptr<HttpServer> server = Start({}, Echo);
  for (std::string bad : {std::string("GARBAGE\r\n\r\n"),
                          std::string("GET / HTTP/1.1\r\nBad Header Line\r\n\r\n"),
                          std::string("GET / HTTP/9.9\r\n\r\n"),
                          std::string("POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n"),
                          std::string("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")}) {
    TestConnection c(server->port());
    ASSERT_TRUE(c.SendRaw(bad));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value()) << bad;
    EXPECT_EQ(r->result_int(), 400u) << bad;
    EXPECT_EQ(ErrorCodeOf(*r), "invalid_http");
    EXPECT_TRUE(c.ClosedByPeer());
  }
  EXPECT_EQ(server->stats().requests, 0);
  ExpectServing(*server);
}

TEST(HttpServerTest, OversizedBodyIs413WithoutReadingIt) {
  HttpServerOptions options;
  options.max_body_bytes = 1 << 20;
  std::unique_ptr<HttpServer> server = Start(options, Echo);
  {
    // 100 MB announced; the client sends a first slice and then waits for the answer.
    TestConnection c(server->port());
    ASSERT_TRUE(c.SendRaw("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000"
                          "\r\n\r\n" + std::string(64 * 1024, 'x')));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->result_int(), 413u);
    EXPECT_EQ(ErrorCodeOf(*r), "request_too_large");
    EXPECT_THAT(r->body(), HasSubstr("CONNEX_HTTP_MAX_BODY_BYTES"));
    EXPECT_FALSE(r->keep_alive());
  }
  {
    // Chunked, no length announced: refused once the limit is passed.
    TestConnection c(server->port());
    std::string chunk(256 * 1024, 'y');
    std::string head = "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    std::string body;
    for (int i = 0; i < 5; ++i) body += "40000\r\n" + chunk + "\r\n";
    c.SendRaw(head + body);  // may break once the server has answered and closed
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->result_int(), 413u);
  }
  {
    TestConnection c(server->port());
    ASSERT_TRUE(c.SendRaw("GET / HTTP/1.1\r\nX-Big: " + std::string(64 * 1024, 'h') + "\r\n\r\n"));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->result_int(), 431u);
  }
  EXPECT_EQ(server->stats().requests, 0);
  ExpectServing(*server);
}

TEST(HttpServerTest, ExpectContinueIsAnswered) {
  std::unique_ptr<HttpServer> server = Start({}, Echo);
  TestConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("POST /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                        "Content-Length: 5\r\n\r\n"));
  std::optional<Response> interim = c.Read();
  ASSERT_TRUE(interim.has_value());
  EXPECT_EQ(interim->result_int(), 100u);
  ASSERT_TRUE(c.SendRaw("hello"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body(), "POST /x hello");
}

TEST(HttpServerTest, SlowClientsTimeOut) {
  HttpServerOptions options;
  options.read_timeout_ms = 200;
  std::unique_ptr<HttpServer> server = Start(options, Echo);
  {
    // Half a request, then nothing (slowloris): 408, closed.
    TestConnection c(server->port());
    ASSERT_TRUE(c.SendRaw("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Le"));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->result_int(), 408u);
    EXPECT_EQ(ErrorCodeOf(*r), "request_timeout");
    EXPECT_TRUE(c.ClosedByPeer());
  }
  {
    // A body that never completes.
    TestConnection c(server->port());
    ASSERT_TRUE(c.SendRaw("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->result_int(), 408u);
  }
  {
    // A connection that sends nothing, or stays idle after a response, is closed quietly.
    TestConnection idle(server->port());
    EXPECT_TRUE(idle.ClosedByPeer());
    TestConnection kept(server->port());
    ASSERT_TRUE(kept.Send("GET", "/"));
    ASSERT_TRUE(kept.Read().has_value());
    EXPECT_TRUE(kept.ClosedByPeer());
  }
  EXPECT_TRUE(WaitUntil([&] { return server->stats().open_connections == 0; }, kDeadlineMs));
  ExpectServing(*server);
}

TEST(HttpServerTest, ClientDisconnectCancelsAStream) {
  Parked parked;
  std::unique_ptr<HttpServer> server = Start({}, parked.Handler());
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("POST", "/v1/completions", "{}"));
  ASSERT_TRUE(WaitUntil([&] { return parked.size() == 1; }, kDeadlineMs));
  std::shared_ptr<HttpExchange> exchange = parked.Take()[0];
  std::atomic<int> cancels{0};
  exchange->OnCancel([&] { cancels.fetch_add(1); });
  ASSERT_TRUE(exchange->StartStream());
  ASSERT_TRUE(exchange->Send("data: 1\n\n"));
  ASSERT_TRUE(c.ReadHead());
  ASSERT_TRUE(c.ReadUntil("data: 1"));
  c.Close();
  ASSERT_TRUE(WaitUntil([&] { return cancels.load() == 1; }, kDeadlineMs));
  EXPECT_TRUE(exchange->cancelled());
  EXPECT_FALSE(exchange->Send("data: 2\n\n"));
  // A callback set after the fact runs at once.
  bool late = false;
  exchange->OnCancel([&] { late = true; });
  EXPECT_TRUE(late);
  EXPECT_EQ(cancels.load(), 1);
  EXPECT_EQ(server->stats().cancelled, 1);
  ExpectServing(*server, &parked);
}

TEST(HttpServerTest, ClientDisconnectCancelsAPendingResponse) {
  Parked parked;
  std::unique_ptr<HttpServer> server = Start({}, parked.Handler());
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("POST", "/v1/completions", "{}"));
  ASSERT_TRUE(WaitUntil([&] { return parked.size() == 1; }, kDeadlineMs));
  std::shared_ptr<HttpExchange> exchange = parked.Take()[0];
  std::atomic<bool> cancelled{false};
  exchange->OnCancel([&] { cancelled = true; });
  c.Close();
  ASSERT_TRUE(WaitUntil([&] { return cancelled.load(); }, kDeadlineMs));
  EXPECT_FALSE(exchange->Respond(HttpResponse{}));
}

TEST(HttpServerTest, AClientThatDoesNotReadIsDroppedAndCancelled) {
  HttpServerOptions options;
  options.write_timeout_ms = 300;
  options.max_pending_write_bytes = 256 * 1024;
  Parked parked;
  std::unique_ptr<HttpServer> server = Start(options, parked.Handler());
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("GET", "/stream"));
  ASSERT_TRUE(WaitUntil([&] { return parked.size() == 1; }, kDeadlineMs));
  std::shared_ptr<HttpExchange> exchange = parked.Take()[0];
  std::atomic<bool> cancelled{false};
  exchange->OnCancel([&] { cancelled = true; });
  ASSERT_TRUE(exchange->StartStream());
  const std::string chunk(64 * 1024, 'z');
  // The client never reads: the socket buffers fill, the queue passes its bound or a write
  // passes its deadline, and the exchange is cancelled.
  ASSERT_TRUE(WaitUntil([&] { return !exchange->Send(chunk); }, kDeadlineMs, 1));
  ASSERT_TRUE(WaitUntil([&] { return cancelled.load(); }, kDeadlineMs));
  ExpectServing(*server, &parked);
}

TEST(HttpServerTest, TwoHundredConcurrentRequestsAreServed) {
  HttpServerOptions options;
  options.max_connections = 256;
  Parked parked;
  std::unique_ptr<HttpServer> server = Start(options, parked.Handler());
  std::vector<std::unique_ptr<TestConnection>> clients;
  for (int i = 0; i < 200; ++i) {
    clients.push_back(std::make_unique<TestConnection>(server->port()));
    ASSERT_TRUE(clients.back()->Send("GET", "/r" + std::to_string(i)));
  }
  // All 200 are in the handler's hands at the same time.
  ASSERT_TRUE(WaitUntil([&] { return parked.size() == 200; }, kDeadlineMs));
  for (const std::shared_ptr<HttpExchange>& exchange : parked.Take()) {
    exchange->Respond(HttpResponse{200, "text/plain", exchange->request().path, {}});
  }
  for (int i = 0; i < 200; ++i) {
    std::optional<Response> r = clients[i]->Read();
    ASSERT_TRUE(r.has_value()) << i;
    EXPECT_EQ(r->body(), "/r" + std::to_string(i));
  }
  EXPECT_EQ(server->stats().refused_connections, 0);
}

TEST(HttpServerTest, ConnectionsOverTheLimitGet503) {
  HttpServerOptions options;
  options.max_connections = 50;
  std::unique_ptr<HttpServer> server = Start(options, Echo);
  std::vector<std::unique_ptr<TestConnection>> clients;
  for (int i = 0; i < 200; ++i) {
    clients.push_back(std::make_unique<TestConnection>(server->port()));
    ASSERT_TRUE(clients.back()->Send("GET", "/"));
  }
  int served = 0;
  int refused = 0;
  for (auto& client : clients) {
    std::optional<Response> r = client->Read();
    ASSERT_TRUE(r.has_value());
    if (r->result_int() == 200) {
      ++served;
    } else {
      EXPECT_EQ(r->result_int(), 503u);
      EXPECT_EQ(ErrorCodeOf(*r), "server_overloaded");
      ++refused;
    }
  }
  // The served clients keep their connections open, so exactly the limit is served.
  EXPECT_EQ(served, 50);
  EXPECT_EQ(refused, 150);
  clients.clear();
  ASSERT_TRUE(WaitUntil([&] { return server->stats().open_connections == 0; }, kDeadlineMs));
  ExpectServing(*server);
}

TEST(HttpServerTest, StopDrainsThenCancels) {
  HttpServerOptions options;
  options.drain_timeout_ms = 100;
  Parked parked;
  std::unique_ptr<HttpServer> server = Start(options, parked.Handler());
  TestConnection c(server->port());
  TestConnection idle(server->port());
  ASSERT_TRUE(c.Send("GET", "/forever"));
  ASSERT_TRUE(WaitUntil([&] { return parked.size() == 1; }, kDeadlineMs));
  std::shared_ptr<HttpExchange> exchange = parked.Take()[0];
  std::atomic<bool> cancelled{false};
  exchange->OnCancel([&] { cancelled = true; });
  ASSERT_TRUE(exchange->StartStream());
  server->Stop();  // the stream never ends: cancelled after the drain timeout
  EXPECT_TRUE(cancelled.load());
  EXPECT_FALSE(exchange->Send("after stop"));
  EXPECT_TRUE(idle.ClosedByPeer());
  server->Stop();  // idempotent
}

TEST(HttpServerTest, StopLetsAResponseInFlightFinish) {
  Parked parked;
  std::unique_ptr<HttpServer> server = Start({}, parked.Handler());
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("GET", "/slow"));
  ASSERT_TRUE(WaitUntil([&] { return parked.size() == 1; }, kDeadlineMs));
  std::thread stopper([&] { server->Stop(); });
  // Once the listener is closed the server is stopping; the response in flight still goes out.
  ASSERT_TRUE(WaitUntil([&] { return !CanConnect(server->port()); }, kDeadlineMs));
  std::shared_ptr<HttpExchange> exchange = parked.Take()[0];
  exchange->Respond(HttpResponse{200, "text/plain", "done", {}});
  std::optional<Response> r = c.Read();
  stopper.join();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body(), "done");
  EXPECT_FALSE(r->keep_alive());
}

TEST(HttpServerTest, BadAddressesAndOptions) {
  HttpServerOptions options;
  options.host = "203.0.113.1";  // TEST-NET-3: not an address of this machine
  absl::StatusOr<std::unique_ptr<HttpServer>> server = StartHttpServer(options, Echo);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(server.status().message(), HasSubstr("203.0.113.1"));
  EXPECT_FALSE(StartHttpServer({}, nullptr).ok());
}

TEST(HttpServerTest, OptionsFromEnv) {
  setenv("CONNEX_HTTP_MAX_BODY_BYTES", "2M", 1);
  setenv("CONNEX_HTTP_READ_TIMEOUT_MS", "1500", 1);
  absl::StatusOr<HttpServerOptions> options = HttpServerOptions::FromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->max_body_bytes, 2u << 20);
  EXPECT_EQ(options->read_timeout_ms, 1500);
  setenv("CONNEX_HTTP_MAX_CONNECTIONS", "none", 1);
  options = HttpServerOptions::FromEnv();
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(options.status().message(), HasSubstr("CONNEX_HTTP_MAX_CONNECTIONS"));
  unsetenv("CONNEX_HTTP_MAX_BODY_BYTES");
  unsetenv("CONNEX_HTTP_READ_TIMEOUT_MS");
  unsetenv("CONNEX_HTTP_MAX_CONNECTIONS");
}

}  // namespace
}  // namespace connex::serving
