// ResumeProxy resuming a response on another replica (testing/fake_replica.h): mid-stream, after
// the last chunk, for a whole (non-streamed) answer and for a chat stream — no token lost or
// repeated.
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

// What a client got for `kStreamRequest`, streamed or not, from a proxy whose first replica
// acts `first` (its second serves): the tokens and the finish reason; a stream must end with
// [DONE], its usage counting `tokens`, no error.
struct Answer {
  std::vector<int32_t> tokens;
  std::string finish;
  size_t upstream_requests = 0;
};

class FinishedAnswerTest : public ResumeProxyTest {
 protected:
  Answer Run(FakeReplica::Script first, bool stream) {
    FakeReplica a, b;
    a.Then(first);
    StartProxy();
    proxy_->SetReplicas({a.replica("a"), b.replica("b")});
    Json request = kStreamRequest;
    request["stream"] = stream;
    if (!stream) request.erase("stream_options");
    auto r = Post("/v1/completions", request);
    Answer answer;
    if (!r) {
      ADD_FAILURE() << "no answer";
      return answer;
    }
    EXPECT_EQ(r->result_int(), 200) << r->body();
    if (stream) {
      Streamed s = Collect(Events(r->body()));
      answer.tokens = s.tokens;
      answer.finish = s.finish;
      EXPECT_EQ(s.done, 1);
      EXPECT_EQ(s.usage["completion_tokens"], s.tokens.size());
      EXPECT_TRUE(s.error.is_null()) << s.error.dump();
    } else {
      Json body = Json::parse(r->body());
      answer.tokens = body["choices"][0]["token_ids"].get<std::vector<int32_t>>();
      answer.finish = body["choices"][0]["finish_reason"].get<std::string>();
    }
    answer.upstream_requests = a.requests().size() + b.requests().size();
    EXPECT_EQ(proxy_->stats().completed, 1);
    proxy_.reset();
    return answer;
  }
};

// The chunk with finish_reason reached the client, then the replica's connection broke before
// [DONE]: the answer is whole. A resume would put the EOS into the prompt and stream tokens after
// finish_reason "stop".
TEST_F(FinishedAnswerTest, AStreamThatBreaksAfterItsLastChunkIsCompletedNotResumed) {
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streaming" : "non-streaming");
    Answer answer = Run({FakeReplica::Act::kStopThenDie, 5}, stream);
    EXPECT_EQ(answer.tokens, Expected(6, 5, 5)) << "nothing after the finishing token";
    EXPECT_EQ(answer.finish, "stop");
    EXPECT_EQ(answer.upstream_requests, 1u) << "no resume of a finished answer";
  }
}

// Every token of max_tokens reached the client, then the replica died before the chunk with
// finish_reason: nothing is left to resume, and the client still gets finish_reason "length"
// before [DONE] (once, a stream without one ended "[DONE]" with no finish_reason at all).
TEST_F(FinishedAnswerTest, AReplicaLostBeforeItsFinishChunkStillEndsTheStreamWithOne) {
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streaming" : "non-streaming");
    Answer answer = Run({FakeReplica::Act::kDieBeforeFinish, 0}, stream);
    EXPECT_EQ(answer.tokens, Expected(6, 12, 5));
    EXPECT_EQ(answer.finish, "length");
    EXPECT_EQ(answer.upstream_requests, 1u) << "nothing left to resume";
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

}  // namespace
}  // namespace connex::serving
