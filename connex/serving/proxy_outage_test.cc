// ResumeProxy through outages (testing/fake_replica.h): the only replica restarting within the
// retry budget, an outage past it, a replica that falls silent, a replica's refusal.
#include <gtest/gtest.h>

#include "connex/serving/proxy.h"
#include "connex/serving/testing/fake_replica.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using Json = nlohmann::json;
using testing::Collect;
using testing::Events;
using testing::Expected;
using testing::FakeReplica;
using testing::kStreamRequest;
using testing::ResumeProxyTest;
using testing::Streamed;
using testing::TestConnection;
using testing::Text;

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

// While the proxy waits for a replica to come back, its client's stream hears the keep-alive
// comment (a client with an idle timeout of its own keeps the request); the answer is unchanged.
TEST_F(ResumeProxyTest, AClientsStreamIsKeptAliveWhileTheProxyWaitsForAReplica) {
  FakeReplica a;
  a.Then({FakeReplica::Act::kDieAfter, 3});
  a.Then({FakeReplica::Act::kStatus, 0, 503});  // "starting": the proxy then backs off
  StartProxy(/*retry_budget_ms=*/10'000, 20, 10'000, /*stream_keepalive_ms=*/20);
  proxy_->SetReplicas({a.replica("a@1")});
  TestConnection c(port(), 20'000);
  ASSERT_TRUE(c.Send("POST", "/v1/completions", kStreamRequest.dump()));
  ASSERT_TRUE(c.ReadHead());
  ASSERT_TRUE(Eventually([&] { return proxy_->stats().retries >= 2; }));
  proxy_->SetReplicas({});  // its replica is gone: the proxy waits within its budget
  ASSERT_TRUE(c.ReadUntil(": keep-alive\n\n"));
  proxy_->SetReplicas({a.replica("a@2")});
  ASSERT_TRUE(c.ReadToEnd());
  Streamed s = Collect(Events(c.parser().get().body()));
  EXPECT_EQ(s.tokens, Expected(6, 12, 5));
  EXPECT_EQ(s.done, 1);
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

}  // namespace
}  // namespace connex::serving
