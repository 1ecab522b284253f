// HttpServer's bounds (issue 23): slow clients cannot hold every connection slot, request bodies
// held at once are bounded, inline routes answer while every handler thread is busy, many
// concurrent requests are served and connections over the limit get a 503.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "connex/base/wait.h"
#include "connex/serving/http_server.h"
#include "connex/serving/http_server_test_util.h"
#include "connex/serving/router.h"
#include "connex/serving/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving {
namespace {

using ::testing::HasSubstr;
using testing::Response;
using testing::TestConnection;

// Issue 23: 512 slowloris connections gave everyone else a 503 for the read timeout (10 s). At
// the limit, a new connection takes the place of the one that has waited longest for its
// request's bytes; the slow ones get a 408 (or are closed), the normal request its answer.
TEST(HttpServerTest, SlowClientsCannotHoldEverySlot) {
  HttpServerOptions options;
  options.max_connections = 4;
  options.read_timeout_ms = 60'000;  // the slow ones would hold their slots for a minute
  std::unique_ptr<HttpServer> server = Start(options, Echo);
  std::vector<std::unique_ptr<TestConnection>> slow;
  for (int i = 0; i < options.max_connections; ++i) {
    slow.push_back(std::make_unique<TestConnection>(server->port(), 2000));
    ASSERT_TRUE(slow.back()->SendRaw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"));
  }
  ASSERT_TRUE(WaitUntil([&] { return server->stats().open_connections == 4; }, kDeadlineMs));
  const auto start = std::chrono::steady_clock::now();
  int refused = 0;
  bool served = false;
  WaitUntil(
      [&] {
        TestConnection c(server->port(), 2000);
        if (!c.Send("GET", "/normal")) return false;
        std::optional<Response> r = c.Read();
        if (r && r->result_int() == 200u) served = true;
        if (r && r->result_int() == 503u) ++refused;
        return served;
      },
      kDeadlineMs, 50);
  ASSERT_TRUE(served) << "a normal request never got a slot from the slow ones";
  std::printf(
      "4 slow clients held every slot: a normal request was served after %lld ms (%d 503s "
      "before)\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::steady_clock::now() - start)
                                 .count()),
      refused);
  EXPECT_GE(server->stats().evicted_connections, 1);
  // An evicted slow client got a 408 (part of its request had come).
  int timed_out = 0;
  for (auto& c : slow) {
    std::optional<Response> r = c->Read();
    timed_out += r.has_value() && r->result_int() == 408u;
  }
  EXPECT_GE(timed_out, 1);
}

// Issue 23: 500 held 1 MiB bodies took the proxy from 20 to 521 MB. The bodies held at once are
// bounded: past the budget a request is refused (503) before its body is read.
TEST(HttpServerTest, RequestBodiesHeldAtOnceAreBounded) {
  HttpServerOptions options;
  options.max_body_bytes_in_flight = 1 << 20;
  std::unique_ptr<HttpServer> server = Start(options, Echo);
  const std::string body(700 * 1024, 'b');
  const std::string head =
      "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n";
  TestConnection a(server->port());
  ASSERT_TRUE(a.SendRaw(head + body.substr(0, 1000)));  // holds 700 KiB of the budget
  ASSERT_TRUE(WaitUntil([&] { return server->stats().open_connections == 1; }, kDeadlineMs));
  std::optional<Response> refused;
  WaitUntil(
      [&] {
        TestConnection b(server->port());
        if (!b.SendRaw(head)) return false;
        refused = b.Read();
        return refused.has_value() && refused->result_int() == 503u;
      },
      kDeadlineMs);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->result_int(), 503u);
  EXPECT_EQ(ErrorCodeOf(*refused), "server_overloaded");
  EXPECT_THAT(refused->body(), HasSubstr("CONNEX_HTTP_MAX_BODY_BYTES_IN_FLIGHT"));
  EXPECT_GE(server->stats().refused_bodies, 1);
  // The held one completes; its budget comes back, and the next big body is taken.
  ASSERT_TRUE(a.SendRaw(body.substr(1000)));
  std::optional<Response> r = a.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 200u);
  TestConnection b(server->port());
  ASSERT_TRUE(b.SendRaw(head + body));
  r = b.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result_int(), 200u);
}

// Issue 23: Submit blocked the handler threads behind a long prefill, and /health and /metrics
// waited behind them. Inline routes run on the I/O thread: they answer while every handler
// thread is held.
TEST(HttpServerTest, InlineRoutesAnswerWhileEveryHandlerThreadIsBusy) {
  HttpServerOptions options;
  options.handler_threads = 1;
  std::atomic<bool> release{false};
  Router router;
  router.Add("POST", "/slow", [&](std::shared_ptr<HttpExchange> x) {
    WaitUntil([&] { return release.load(); }, kDeadlineMs);  // holds the only handler thread
    x->Respond(HttpResponse{200, "text/plain", "slow", {}});
  });
  router.AddInline("GET", "/health", [](std::shared_ptr<HttpExchange> x) {
    x->Respond(HttpResponse{200, "text/plain", "ok", {}});
  });
  std::unique_ptr<HttpServer> server =
      Start(options, router.AsHandler(), router.AsInlinePredicate());
  TestConnection slow(server->port());
  ASSERT_TRUE(slow.Send("POST", "/slow", "{}"));
  ASSERT_TRUE(WaitUntil([&] { return server->stats().requests == 1; }, kDeadlineMs));
  TestConnection health(server->port(), 2000);
  ASSERT_TRUE(health.Send("GET", "/health"));
  std::optional<Response> r = health.Read();
  ASSERT_TRUE(r.has_value()) << "/health waited behind the busy handler thread";
  EXPECT_EQ(r->body(), "ok");
  release = true;
  r = slow.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body(), "slow");
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

}  // namespace
}  // namespace connex::serving
