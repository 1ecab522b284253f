// ResumeProxy's front door (testing/fake_replica.h): an undisturbed answer, the seed it gives,
// the input it refuses itself, a client that goes away, /health, /v1/models, /metrics.
#include "connex/serving/proxy.h"

#include <gtest/gtest.h>

#include "connex/serving/testing/fake_replica.h"
#include "connex/serving/testing/scripted_server.h"
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
  ASSERT_TRUE(c.Send("GET", "/v1/models/tiny"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 200);
  EXPECT_EQ(Json::parse(r->body())["object"], "model");
  EXPECT_EQ(Json::parse(r->body())["id"], "tiny");
  ASSERT_TRUE(c.Send("GET", "/v1/models/other"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->result_int(), 404);
  EXPECT_EQ(Json::parse(r->body())["error"]["code"], "model_not_found");
  ASSERT_TRUE(c.Send("GET", "/metrics"));
  r = c.Read();
  ASSERT_TRUE(r);
  EXPECT_NE(r->body().find("connex_proxy_resumes_total"), std::string::npos);
  EXPECT_NE(r->body().find("connex_proxy_replicas 1"), std::string::npos) << r->body();
}

// The proxy's /health used to say 200 while a stage of the model had no live replica (every
// request then waited and failed): it is 503 naming the missing stage.
TEST_F(ResumeProxyTest, ATokenizeForwardedToASilentReplicaEndsByTheIdleTimeout) {
  // It accepts the forwarded request and never answers; the next replica serves.
  testing::ScriptedServer silent("");
  FakeReplica b;
  b.Then({FakeReplica::Act::kStatus, 0, 400});  // an answer of its own, passed on as is
  StartProxy(/*retry_budget_ms=*/5'000, /*max_attempts=*/20, /*idle_timeout_ms=*/300);
  proxy_->SetReplicas(
      {Replica{"silent", "127.0.0.1:" + std::to_string(silent.port())}, b.replica("b")});
  // The client's bound is 20 s: a proxy that waited on the silent replica answers nothing.
  auto r = Post("/tokenize", Json{{"model", "tiny"}, {"prompt", "hi"}});
  ASSERT_TRUE(r) << "the forward waited on the silent replica past its timeout";
  EXPECT_EQ(r->result_int(), 400);
  ASSERT_EQ(b.requests().size(), 1u) << "the next replica was asked";
  EXPECT_EQ(b.requests()[0].first, "/tokenize");
}

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

TEST(ProxyOptionsTest, BadOptionsAreNamed) {
  ProxyOptions options;
  EXPECT_NE(options.Validate().message().find("--model"), std::string_view::npos);
  options.model = "tiny";
  EXPECT_TRUE(options.Validate().ok());
  options.max_attempts = 0;
  EXPECT_NE(options.Validate().message().find("attempts"), std::string_view::npos);
}

}  // namespace
}  // namespace connex::serving
