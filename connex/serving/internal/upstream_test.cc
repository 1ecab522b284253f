#include "connex/serving/internal/upstream.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving::internal {
namespace {

TEST(UpstreamTest, AResumeSendsThePromptAndTheDeliveredTokensWithWhatIsLeft) {
  CompletionRequest r;
  r.endpoint = Endpoint::kChatCompletions;
  r.model = "tiny";
  r.messages = {ChatMessage{"user", "hi"}};
  r.seed = 42;
  r.temperature = 0.8f;
  const std::vector<int32_t> resume = {1, 2, 3, 9};
  nlohmann::json body = nlohmann::json::parse(UpstreamBody(r, resume, 12));
  EXPECT_EQ(body["prompt"], nlohmann::json(resume));
  EXPECT_FALSE(body.contains("messages"));
  EXPECT_EQ(body["max_tokens"], 12);
  EXPECT_EQ(body["seed"], 42);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  // The first attempt sends the client's messages as they came.
  nlohmann::json first = nlohmann::json::parse(UpstreamBody(r, {}, 16));
  EXPECT_EQ(first["messages"][0]["content"], "hi");
  EXPECT_FALSE(first.contains("prompt"));
}

// A resume carries vLLM's sampling and stopping fields as the first attempt does, parsed back
// into the same request by a replica.
TEST(UpstreamTest, EveryAttemptCarriesTheVllmFields) {
  CompletionRequest r;
  r.model = "tiny";
  r.prompt_text = "x";
  r.seed = 7;
  r.temperature = 0.9;
  r.min_p = 0.1;
  r.repetition_penalty = 1.25;
  r.ignore_eos = true;
  r.stop_token_ids = {10, 33};
  const std::vector<int32_t> prompt = {256, 120}, delivered = {257, 11};
  for (const UpstreamRequest& u :
       {MakeUpstreamRequest(r, prompt, {}, 16), MakeUpstreamRequest(r, prompt, delivered, 14)}) {
    RequestLimits limits;
    absl::StatusOr<CompletionRequest> back =
        ParseCompletionRequest(Endpoint::kCompletions, u.body, limits);
    ASSERT_TRUE(back.ok()) << back.status() << " " << u.body;
    EXPECT_DOUBLE_EQ(back->temperature.value_or(-1), 0.9);
    EXPECT_DOUBLE_EQ(back->min_p.value_or(-1), 0.1);
    EXPECT_DOUBLE_EQ(back->repetition_penalty.value_or(-1), 1.25);
    EXPECT_TRUE(back->ignore_eos);
    EXPECT_THAT(back->stop_token_ids, ::testing::ElementsAre(10, 33));
    EXPECT_EQ(back->seed, 7u);
  }
  // What the client did not give is not sent: the replica applies its own defaults (the
  // model's generation_config.json), as it would have to the client's request.
  CompletionRequest plain;
  plain.model = "tiny";
  plain.prompt_text = "x";
  nlohmann::json body = nlohmann::json::parse(UpstreamBody(plain, {}, 16));
  for (const char* field : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                            "ignore_eos", "stop_token_ids"}) {
    EXPECT_FALSE(body.contains(field)) << field;
  }
  // A value the client gave goes, even the built-in default's.
  plain.temperature = 0;
  plain.top_k = -1;
  body = nlohmann::json::parse(UpstreamBody(plain, {}, 16));
  EXPECT_EQ(body["temperature"], 0);
  EXPECT_EQ(body["top_k"], -1);
}

TEST(UpstreamTest, AnErrorBodysMessageOrItsStart) {
  EXPECT_EQ(ErrorMessageOf(R"({"error":{"message":"no such model"}})"), "no such model");
  EXPECT_EQ(ErrorMessageOf("<html>bad gateway</html>"), "<html>bad gateway</html>");
  EXPECT_EQ(ErrorMessageOf(std::string(300, 'x')).size(), 200u);
}

}  // namespace
}  // namespace connex::serving::internal
