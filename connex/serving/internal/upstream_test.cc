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

TEST(UpstreamTest, AnErrorBodysMessageOrItsStart) {
  EXPECT_EQ(ErrorMessageOf(R"({"error":{"message":"no such model"}})"), "no such model");
  EXPECT_EQ(ErrorMessageOf("<html>bad gateway</html>"), "<html>bad gateway</html>");
  EXPECT_EQ(ErrorMessageOf(std::string(300, 'x')).size(), 200u);
}

}  // namespace
}  // namespace connex::serving::internal
