#include "connex/serving/openai_response.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using Json = nlohmann::json;

ResponseHeader Header(Endpoint endpoint) {
  return ResponseHeader{endpoint, MakeResponseId(endpoint, 0xabc), 1700000000, "tiny"};
}

TEST(OpenAiResponseTest, Ids) {
  EXPECT_EQ(MakeResponseId(Endpoint::kCompletions, 255), "cmpl-00000000000000ff");
  EXPECT_EQ(MakeResponseId(Endpoint::kChatCompletions, 1), "chatcmpl-0000000000000001");
}

TEST(OpenAiResponseTest, NonStreamingCompletionAndChat) {
  Completion completion{"hi!", {104, 105, 33}, {256, 72}, FinishReason::kLength};
  Json body = Json::parse(CompletionResponse(Header(Endpoint::kCompletions), completion));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["id"], "cmpl-0000000000000abc");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_EQ(body["model"], "tiny");
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["text"], "hi!");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["token_ids"], Json({104, 105, 33}));
  EXPECT_EQ(body["choices"][0]["prompt_token_ids"], Json({256, 72}));
  EXPECT_EQ(body["usage"],
            Json({{"prompt_tokens", 2}, {"completion_tokens", 3}, {"total_tokens", 5}}));

  completion.finish_reason = FinishReason::kStop;
  body = Json::parse(CompletionResponse(Header(Endpoint::kChatCompletions), completion));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"], Json({{"role", "assistant"}, {"content", "hi!"}}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(body["choices"][0].contains("text"));
}

TEST(OpenAiResponseTest, InvalidUtf8IsReplacedNotThrown) {
  Completion completion{"ok\xC3", {111, 107, 195}, {256}, FinishReason::kLength};
  Json body = Json::parse(CompletionResponse(Header(Endpoint::kCompletions), completion));
  EXPECT_EQ(body["choices"][0]["text"], "ok\xEF\xBF\xBD");  // U+FFFD
}

TEST(OpenAiResponseTest, ModelsAndHealth) {
  std::vector<std::string> models = {"tiny", "small"};
  Json list = Json::parse(ModelsResponse(models, 5));
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 2u);
  EXPECT_EQ(list["data"][1],
            Json({{"id", "small"}, {"object", "model"}, {"created", 5}, {"owned_by", "connex"}}));
  EXPECT_EQ(Json::parse(HealthResponse(true, "")), Json({{"status", "ok"}}));
  EXPECT_EQ(Json::parse(HealthResponse(false, "stage 1 missing"))["reason"], "stage 1 missing");
}

}  // namespace
}  // namespace connex::serving
