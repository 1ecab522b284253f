#include "connex/serving/internal/upstream.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

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

TEST(UpstreamTest, ParsesChunksUsageDoneAndErrors) {
  auto chunk = ParseUpstreamEvent(
      R"({"choices":[{"text":"ab","token_ids":[5,6],"prompt_token_ids":[1],"finish_reason":"stop"}]})");
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(chunk->kind, UpstreamEvent::Kind::kChunk);
  EXPECT_EQ(chunk->text, "ab");
  EXPECT_THAT(chunk->token_ids, ElementsAre(5, 6));
  EXPECT_THAT(chunk->prompt_token_ids, ElementsAre(1));
  EXPECT_EQ(chunk->finish, FinishReason::kStop);
  auto delta = ParseUpstreamEvent(R"({"choices":[{"delta":{"content":"x"}}]})");
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(delta->text, "x");
  EXPECT_EQ(delta->finish, std::nullopt);
  auto usage = ParseUpstreamEvent(R"({"choices":[],"usage":{"completion_tokens":2}})");
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->kind, UpstreamEvent::Kind::kUsage);
  auto done = ParseUpstreamEvent("[DONE]");
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->kind, UpstreamEvent::Kind::kDone);
  auto server = ParseUpstreamEvent(R"({"error":{"message":"drained","type":"server_error"}})");
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(server->kind, UpstreamEvent::Kind::kError);
  EXPECT_TRUE(server->server_error);
  EXPECT_EQ(server->error_message, "drained");
  auto client = ParseUpstreamEvent(R"({"error":{"message":"bad","type":"invalid_request_error"}})");
  ASSERT_TRUE(client.ok());
  EXPECT_FALSE(client->server_error);
}

TEST(UpstreamTest, ABrokenEventIsDataLossNamingWhatIsWrong) {
  auto junk = ParseUpstreamEvent("not json at all");
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(junk.status().message(), HasSubstr("not a JSON object: not json at all"));
  EXPECT_THAT(ParseUpstreamEvent(R"({"id":1})").status().message(), HasSubstr("without choices"));
  EXPECT_THAT(ParseUpstreamEvent(R"({"choices":[3]})").status().message(),
              HasSubstr("not an object"));
}

TEST(UpstreamTest, AnErrorBodysMessageOrItsStart) {
  EXPECT_EQ(ErrorMessageOf(R"({"error":{"message":"no such model"}})"), "no such model");
  EXPECT_EQ(ErrorMessageOf("<html>bad gateway</html>"), "<html>bad gateway</html>");
  EXPECT_EQ(ErrorMessageOf(std::string(300, 'x')).size(), 200u);
}

}  // namespace
}  // namespace connex::serving::internal
