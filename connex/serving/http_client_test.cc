#include "connex/serving/http_client.h"

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "connex/serving/testing/scripted_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace connex::serving {
namespace {

using ::testing::HasSubstr;
using testing::ScriptedServer;

// Runs `call` and waits for it with a generous bound: a client that ignores its deadline fails
// here instead of hanging the test (the server's release then lets the call end).
template <typename F>
auto Bounded(F call) {
  auto result = std::async(std::launch::async, std::move(call));
  EXPECT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the call did not end by its deadline";
  return result;
}

TEST(HttpClientTest, ASilentServerEndsAGetByItsDeadline) {
  auto server = std::make_unique<ScriptedServer>("");
  auto reply = Bounded([&] { return HttpGet("127.0.0.1", server->port(), "/health", 200); });
  server.reset();  // releases a client that ignored its deadline
  absl::StatusOr<HttpReply> got = reply.get();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("GET 127.0.0.1:"));
  EXPECT_THAT(got.status().message(), HasSubstr("/health"));
}

TEST(HttpClientTest, AStreamThatStopsEndsAReadByItsDeadline) {
  ScriptedServer server(
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
      "X-Connex-Replica: m/g0/s0/r1@7\r\n\r\n6\r\ndata: \r\n");
  const int64_t deadline = SteadyNowNs() + 10'000'000'000;
  auto connection = HttpClientConnection::Connect("127.0.0.1", server.port(), deadline);
  ASSERT_TRUE(connection.ok()) << connection.status();
  ASSERT_TRUE((*connection)
                  ->Send("POST", "/v1/completions", {"Host: x"}, std::string("{}"),
                         "application/json", deadline)
                  .ok());
  absl::StatusOr<HttpResponseHead> head = (*connection)->ReadHead(deadline);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->Header("x-connex-replica"), "m/g0/s0/r1@7");
  EXPECT_EQ(head->Header("Retry-After"), std::nullopt);
  std::string body;
  absl::StatusOr<bool> more = (*connection)->ReadSome(&body, deadline);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_TRUE(*more);
  EXPECT_EQ(body, "data: ");
  auto next = Bounded([&] { return (*connection)->ReadSome(&body, SteadyNowNs() + 200'000'000); });
  absl::StatusOr<bool> stalled = next.get();
  ASSERT_FALSE(stalled.ok());
  EXPECT_EQ(stalled.status().code(), absl::StatusCode::kDeadlineExceeded) << stalled.status();
}

TEST(HttpClientTest, ReadsChunkedAndLengthAndConnectionDelimitedBodies) {
  {
    ScriptedServer server(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
    absl::StatusOr<HttpReply> got = HttpGet("127.0.0.1", server.port(), "/", 10'000);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->status, 200);
    EXPECT_EQ(got->body, "abcde");
  }
  {
    ScriptedServer server("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy");
    absl::StatusOr<HttpReply> got = HttpGet("127.0.0.1", server.port(), "/", 10'000);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->status, 503);
    EXPECT_EQ(got->body, "busy");
  }
  {
    ScriptedServer server("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
                          /*close_after_reply=*/true);
    absl::StatusOr<HttpReply> got = HttpGet("127.0.0.1", server.port(), "/", 10'000);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->body, "to the end");
  }
}

TEST(HttpClientTest, BrokenAnswersAreErrorsNamingWhatWasWrong) {
  {
    ScriptedServer server("SSH-2.0-OpenSSH\r\n\r\n");
    absl::StatusOr<HttpReply> got = HttpGet("127.0.0.1", server.port(), "/", 10'000);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(got.status().message(), HasSubstr("not an HTTP response"));
  }
  {
    ScriptedServer server("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                          /*close_after_reply=*/true);
    absl::StatusOr<HttpReply> got = HttpGet("127.0.0.1", server.port(), "/", 10'000);
    ASSERT_FALSE(got.ok());
    EXPECT_THAT(got.status().message(), HasSubstr("in the middle of the body"));
  }
  {
    ScriptedServer server("", /*close_after_reply=*/true);
    absl::StatusOr<HttpReply> got = HttpGet("127.0.0.1", server.port(), "/", 10'000);
    ASSERT_FALSE(got.ok());
    EXPECT_THAT(got.status().message(), HasSubstr("before the response's head"));
  }
}

TEST(HttpClientTest, ARefusedConnectionOrAHostThatIsNotAnAddressIsAnError) {
  uint16_t closed_port;
  {
    ScriptedServer server("", /*close_after_reply=*/true);
    closed_port = server.port();
    // Take the server's one connection so that its thread ends and the port closes.
    auto connection =
        HttpClientConnection::Connect("127.0.0.1", closed_port, SteadyNowNs() + 10'000'000'000);
    ASSERT_TRUE(connection.ok());
  }
  absl::StatusOr<HttpReply> refused = HttpGet("127.0.0.1", closed_port, "/", 10'000);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("refused"));
  absl::StatusOr<HttpReply> bad = HttpGet("localhost.invalid", 80, "/", 100);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("not a numeric address"));
}

}  // namespace
}  // namespace connex::serving
