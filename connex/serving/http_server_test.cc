// HttpServer: serving on a free port with keep-alive, pipelining, headers, streams (chunked, and
// unchunked to HTTP/1.0), malformed, oversized and compressed requests refused with their status,
// 100-continue, and the server's stop, addresses and options. Clients that stall or leave are
// http_server_cancel_test.cc; the bounds on connections, bodies and handler threads
// http_server_limits_test.cc.
#include "connex/serving/http_server.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "connex/base/wait.h"
#include "connex/serving/http_server_test_util.h"
#include "connex/serving/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving {
namespace {

using ::testing::HasSubstr;
using testing::Response;
using testing::TestConnection;

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

TEST(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  std::unique_ptr<HttpServer> server = Start({}, Echo);
  TestConnection c(server->port());
  ASSERT_TRUE(
      c.SendRaw("GET /a HTTP/1.1\r\nHost: t\r\n\r\n"
                "POST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"
                "GET /c HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"));
  for (std::string expected : {"GET /a ", "POST /b hi", "GET /c "}) {
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value()) << expected;
    EXPECT_EQ(r->body(), expected);
  }
  EXPECT_TRUE(c.ClosedByPeer());  // after the request that asked for it
}

TEST(HttpServerTest, HeadersReachTheHandler) {
  std::unique_ptr<HttpServer> server = Start({}, [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(HttpResponse{201,
                                   "text/plain",
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

// A handler's header replaces the server's of the same name (any case), and a CR or LF in it
// cannot split the head into a header of the handler's choosing.
TEST(HttpServerTest, AHandlersHeadersReplaceTheServersAndCannotSplitTheHead) {
  std::unique_ptr<HttpServer> server = Start({}, [](std::shared_ptr<HttpExchange> exchange) {
    exchange->Respond(HttpResponse{
        200, "text/plain", "ok", {{"server", "mine"}, {"X-Note", "a\r\nX-Injected: 1"}}});
  });
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("GET", "/", ""));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body(), "ok");
  EXPECT_EQ((*r)["Server"], "mine");
  EXPECT_EQ(r->count("Server"), 1u) << "one Server field, the handler's";
  EXPECT_EQ((*r)["X-Note"], "a  X-Injected: 1");
  EXPECT_EQ(r->count("X-Injected"), 0u);
  EXPECT_EQ((*r)["Content-Length"], "2");
}

TEST(HttpServerTest, StreamsChunksAsTheyAreProduced) {
  OneParked t;
  ASSERT_NE(t.exchange, nullptr);
  TestConnection& c = *t.client;
  ASSERT_TRUE(t.exchange->StartStream());
  ASSERT_TRUE(t.exchange->Send("data: one\n\n"));
  ASSERT_TRUE(c.ReadHead());
  EXPECT_EQ(c.parser().get()[testing::http::field::content_type], "text/event-stream");
  EXPECT_TRUE(c.parser().chunked());
  // The second chunk is produced only after the client has seen the first.
  ASSERT_TRUE(c.ReadUntil("data: one\n\n"));
  ASSERT_TRUE(t.exchange->Send("data: two\n\n"));
  ASSERT_TRUE(c.ReadUntil("data: two\n\n"));
  t.exchange->EndStream();
  EXPECT_FALSE(t.exchange->Send("late"));
  ASSERT_TRUE(c.ReadToEnd());
  EXPECT_EQ(c.parser().get().body(), "data: one\n\ndata: two\n\n");
  EXPECT_FALSE(t.exchange->cancelled());
  // The connection serves its next request after the stream.
  ASSERT_TRUE(c.Send("GET", "/next"));
  std::shared_ptr<HttpExchange> next = t.parked.Await();
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->request().path, "/next");
}

TEST(HttpServerTest, MalformedRequestsGet400AndTheServerGoesOn) {
  std::unique_ptr<HttpServer> server = Start({}, Echo);
  for (std::string bad :
       {std::string("GARBAGE\r\n\r\n"), std::string("GET / HTTP/1.1\r\nBad Header Line\r\n\r\n"),
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
    ASSERT_TRUE(
        c.SendRaw("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000"
                  "\r\n\r\n" +
                  std::string(64 * 1024, 'x')));
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
  ASSERT_TRUE(
      c.SendRaw("POST /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                "Content-Length: 5\r\n\r\n"));
  std::optional<Response> interim = c.Read();
  ASSERT_TRUE(interim.has_value());
  EXPECT_EQ(interim->result_int(), 100u);
  ASSERT_TRUE(c.SendRaw("hello"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body(), "POST /x hello");
}

// HTTP/1.0 has no chunked encoding: a stream is the body as it comes, ended by the close.
TEST(HttpServerTest, AnHttp10ClientGetsAStreamWithoutChunkedEncoding) {
  Parked parked;
  std::unique_ptr<HttpServer> server = Start({}, parked.Handler());
  TestConnection c(server->port());
  ASSERT_TRUE(c.SendRaw("POST /v1/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}"));
  std::shared_ptr<HttpExchange> exchange = parked.Await();
  ASSERT_NE(exchange, nullptr);
  ASSERT_TRUE(exchange->StartStream());
  ASSERT_TRUE(exchange->Send("data: one\n\n"));
  ASSERT_TRUE(exchange->Send("data: two\n\n"));
  exchange->EndStream();
  ASSERT_TRUE(c.ReadHead());
  EXPECT_EQ(c.parser().get().version(), 10u);
  EXPECT_FALSE(c.parser().chunked());
  EXPECT_EQ(c.parser().get().count(testing::http::field::transfer_encoding), 0u);
  ASSERT_TRUE(c.ReadToEnd());  // ends at the server's close
  EXPECT_EQ(c.parser().get().body(), "data: one\n\ndata: two\n\n");
  // A whole response to HTTP/1.0 is HTTP/1.0 too.
  std::unique_ptr<HttpServer> echo = Start({}, Echo);
  TestConnection e(echo->port());
  ASSERT_TRUE(e.SendRaw("GET /x HTTP/1.0\r\n\r\n"));
  std::optional<Response> r = e.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->version(), 10u);
  EXPECT_EQ(r->body(), "GET /x ");
  EXPECT_TRUE(e.ClosedByPeer());
}

// A stream whose producer has nothing to send gets the keep-alive chunk after each quiet period
// while the producer says it is alive, and none once it says it is not; the stream's own chunks
// go as they come, and it ends as any stream.
TEST(HttpServerTest, AStreamIsKeptAliveOnlyWhileItsProducerIsAlive) {
  Parked parked;
  std::unique_ptr<HttpServer> server = Start({}, parked.Handler());
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("POST", "/v1/completions", "{}"));
  std::shared_ptr<HttpExchange> exchange = parked.Await();
  ASSERT_NE(exchange, nullptr);
  EXPECT_FALSE(exchange->KeepStreamAlive(20, ": k\n\n", [] { return true; }));  // not a stream
  ASSERT_TRUE(exchange->StartStream());
  EXPECT_FALSE(exchange->KeepStreamAlive(0, ": k\n\n", [] { return true; }));
  // Alive when asked the first two times, then not.
  std::atomic<int> asked{0};
  ASSERT_TRUE(exchange->KeepStreamAlive(20, ": keep-alive\n\n", [&] { return ++asked <= 2; }));
  ASSERT_TRUE(c.ReadHead());
  ASSERT_TRUE(c.ReadUntil(": keep-alive\n\n: keep-alive\n\n"));
  ASSERT_TRUE(WaitUntil([&] { return asked.load() >= 5; }, kDeadlineMs));
  ASSERT_TRUE(exchange->Send("data: one\n\n"));
  exchange->EndStream();
  ASSERT_TRUE(c.ReadToEnd());
  EXPECT_EQ(c.parser().get().body(), ": keep-alive\n\n: keep-alive\n\ndata: one\n\n");
  // The stream is over: the connection serves its next request with nothing of the keep-alive
  // in it, and the producer is not asked any more.
  const int asked_at_end = asked.load();
  ASSERT_TRUE(c.Send("POST", "/v1/completions", "{}"));
  std::shared_ptr<HttpExchange> second = parked.Await();
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->Respond(HttpResponse{200, "text/plain", "whole", {}}));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body(), "whole");
  EXPECT_EQ(asked.load(), asked_at_end);
}

// Nothing decodes a compressed body: parsed as JSON it would be garbage, so it is refused.
TEST(HttpServerTest, ABodyInAContentEncodingIsRefusedWith415) {
  std::unique_ptr<HttpServer> server = Start({}, Echo);
  for (std::string coding : {"gzip", "deflate", "br"}) {
    TestConnection c(server->port());
    ASSERT_TRUE(c.Send("POST", "/v1/completions", "{}", "Content-Encoding: " + coding + "\r\n"));
    std::optional<Response> r = c.Read();
    ASSERT_TRUE(r.has_value()) << coding;
    EXPECT_EQ(r->result_int(), 415u) << coding;
    EXPECT_EQ(ErrorCodeOf(*r), "unsupported_content_encoding");
    EXPECT_THAT(r->body(), HasSubstr(coding));
  }
  EXPECT_EQ(server->stats().requests, 0);
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("POST", "/v1/echo", "ok", "Content-Encoding: identity\r\n"));
  std::optional<Response> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 200u);
}

TEST(HttpServerTest, StopDrainsThenCancels) {
  HttpServerOptions options;
  options.drain_timeout_ms = 100;
  OneParked t(options);
  ASSERT_NE(t.exchange, nullptr);
  TestConnection idle(t.server->port());
  ASSERT_TRUE(t.exchange->StartStream());
  t.server->Stop();  // the stream never ends: cancelled after the drain timeout
  EXPECT_EQ(t.cancels.load(), 1);
  EXPECT_FALSE(t.exchange->Send("after stop"));
  EXPECT_TRUE(idle.ClosedByPeer());
  t.server->Stop();  // idempotent
}

TEST(HttpServerTest, StopLetsAResponseInFlightFinish) {
  OneParked t;
  ASSERT_NE(t.exchange, nullptr);
  std::thread stopper([&] { t.server->Stop(); });
  // Once the listener is closed the server is stopping; the response in flight still goes out.
  ASSERT_TRUE(WaitUntil([&] { return !CanConnect(t.server->port()); }, kDeadlineMs));
  t.exchange->Respond(HttpResponse{200, "text/plain", "done", {}});
  std::optional<Response> r = t.client->Read();
  stopper.join();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body(), "done");
  EXPECT_FALSE(r->keep_alive());
  EXPECT_EQ(t.cancels.load(), 0);
}

TEST(HttpServerTest, BadAddressesAndOptions) {
  HttpServerOptions options;
  options.host = "203.0.113.1";  // TEST-NET-3: not an address of this machine
  // Beyond loopback the API (no authentication of its own) needs --insecure first.
  unsetenv("CONNEX_INSECURE");
  absl::StatusOr<std::unique_ptr<HttpServer>> server = StartHttpServer(options, Echo);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("refusing to listen on '203.0.113.1'"));
  setenv("CONNEX_INSECURE", "1", 1);
  server = StartHttpServer(options, Echo);
  unsetenv("CONNEX_INSECURE");
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
