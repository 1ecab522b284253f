// HttpServer and clients that stall or leave: a slow request times out (408), a client that
// disconnects cancels its stream or pending response, one that sends more than a header's worth
// and leaves cancels its request (and gets its answer, then the close, if it stays), and one that
// does not read its stream is dropped and its request cancelled.
#include <memory>
#include <optional>
#include <string>

#include "connex/base/wait.h"
#include "connex/serving/http_server.h"
#include "connex/serving/http_server_test_util.h"
#include "connex/serving/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving {
namespace {

using ::testing::HasSubstr;
using testing::Response;
using testing::TestConnection;

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
  OneParked t;
  ASSERT_NE(t.exchange, nullptr);
  ASSERT_TRUE(t.exchange->StartStream());
  ASSERT_TRUE(t.exchange->Send("data: 1\n\n"));
  ASSERT_TRUE(t.client->ReadHead());
  ASSERT_TRUE(t.client->ReadUntil("data: 1"));
  t.client->Close();
  ASSERT_TRUE(WaitUntil([&] { return t.cancels.load() == 1; }, kDeadlineMs));
  EXPECT_TRUE(t.exchange->cancelled());
  EXPECT_FALSE(t.exchange->Send("data: 2\n\n"));
  // A callback set after the fact runs at once.
  bool late = false;
  t.exchange->OnCancel([&] { late = true; });
  EXPECT_TRUE(late);
  EXPECT_EQ(t.cancels.load(), 1);
  EXPECT_EQ(t.server->stats().cancelled, 1);
  ExpectServing(*t.server, &t.parked);
}

TEST(HttpServerTest, ClientDisconnectCancelsAPendingResponse) {
  OneParked t;
  ASSERT_NE(t.exchange, nullptr);
  t.client->Close();
  ASSERT_TRUE(WaitUntil([&] { return t.cancels.load() == 1; }, kDeadlineMs));
  EXPECT_FALSE(t.exchange->Respond(HttpResponse{}));
}

// A completion request followed by more than a header's worth of further bytes: the connection
// stops keeping them but goes on watching the client, so that its end cancels the request (it
// used to drop the connection unanswered with the request running on, its slot freed).
TEST(HttpServerTest, AClientThatSendsMoreThanAHeadersWorthAndLeavesCancelsItsRequest) {
  OneParked t;
  ASSERT_NE(t.exchange, nullptr);
  ASSERT_TRUE(t.client->SendRaw(std::string(64 * 1024, 'x')));
  // Still connected: the request stays, the server keeps its slot.
  ASSERT_TRUE(WaitUntil([&] { return t.server->stats().open_connections == 1; }, kDeadlineMs));
  t.client->Close();
  ASSERT_TRUE(WaitUntil([&] { return t.cancels.load() == 1; }, kDeadlineMs));
  EXPECT_TRUE(WaitUntil([&] { return t.server->stats().open_connections == 0; }, kDeadlineMs));
  ExpectServing(*t.server, &t.parked);
}

TEST(HttpServerTest, AClientThatSendsMoreThanAHeadersWorthGetsItsAnswerThenTheClose) {
  OneParked t;
  ASSERT_NE(t.exchange, nullptr);
  ASSERT_TRUE(t.client->SendRaw(std::string(64 * 1024, 'x')));
  ASSERT_TRUE(t.exchange->Respond(HttpResponse{200, "text/plain", "done", {}}));
  std::optional<Response> r = t.client->Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body(), "done");
  // The junk is no request: discarded (when more than a header's worth came before the answer)
  // or refused as one (when the answer went first); either way the connection ends.
  // (A read that sees the end returns nullopt; the connection is over then.)
  if (std::optional<Response> junk = t.client->Read()) {
    EXPECT_TRUE(junk->result_int() == 400u || junk->result_int() == 431u) << junk->result_int();
    EXPECT_TRUE(t.client->ClosedByPeer());
  }
  EXPECT_EQ(t.cancels.load(), 0);
  EXPECT_EQ(t.parked.size(), 0u) << "the junk reached the handler";
}

TEST(HttpServerTest, AClientThatDoesNotReadIsDroppedAndCancelled) {
  HttpServerOptions options;
  options.write_timeout_ms = 300;
  options.max_pending_write_bytes = 256 * 1024;
  OneParked t(options);
  ASSERT_NE(t.exchange, nullptr);
  ASSERT_TRUE(t.exchange->StartStream());
  const std::string chunk(64 * 1024, 'z');
  // The client never reads: the socket buffers fill, the queue passes its bound or a write
  // passes its deadline, and the exchange is cancelled.
  ASSERT_TRUE(WaitUntil([&] { return !t.exchange->Send(chunk); }, kDeadlineMs, 1));
  ASSERT_TRUE(WaitUntil([&] { return t.cancels.load() == 1; }, kDeadlineMs));
  ExpectServing(*t.server, &t.parked);
}

}  // namespace
}  // namespace connex::serving
