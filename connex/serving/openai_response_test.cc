#include "connex/serving/openai_response.h"

#include <string>
#include <vector>

#include "connex/serving/api_error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::StartsWith;

// The JSON of one SSE event `data: {...}\n\n`.
Json EventJson(const std::string& event) {
  EXPECT_THAT(event, StartsWith("data: "));
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  std::string payload = event.substr(6, event.size() - 8);
  EXPECT_EQ(payload.find('\n'), std::string::npos);
  return Json::parse(payload);
}

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

TEST(OpenAiResponseTest, ChatStreamChunks) {
  ChunkBuilder chunks(Header(Endpoint::kChatCompletions), /*include_usage=*/true);
  std::vector<int32_t> prompt = {256, 72};
  Json first = EventJson(chunks.Delta("He", std::vector<int32_t>{72, 101}, prompt));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["id"], "chatcmpl-0000000000000abc");
  EXPECT_EQ(first["choices"][0]["delta"], Json({{"role", "assistant"}, {"content", "He"}}));
  EXPECT_EQ(first["choices"][0]["token_ids"], Json({72, 101}));
  EXPECT_EQ(first["choices"][0]["prompt_token_ids"], Json({256, 72}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first["usage"].is_null());
  EXPECT_TRUE(first.contains("usage"));

  Json next = EventJson(chunks.Delta("y", std::vector<int32_t>{121}, prompt));
  EXPECT_EQ(next["choices"][0]["delta"], Json({{"content", "y"}}));
  EXPECT_FALSE(next["choices"][0].contains("prompt_token_ids"));

  Json last = EventJson(chunks.Delta("", {}, prompt, FinishReason::kStop));
  EXPECT_EQ(last["choices"][0]["delta"], Json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["choices"][0]["token_ids"], Json::array());

  Json usage = EventJson(chunks.UsageChunk({2, 3}));
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
}

TEST(OpenAiResponseTest, CompletionStreamChunksWithoutUsage) {
  ChunkBuilder chunks(Header(Endpoint::kCompletions), /*include_usage=*/false);
  Json first = EventJson(chunks.Delta("a", std::vector<int32_t>{97}, std::vector<int32_t>{256},
                                      FinishReason::kLength));
  EXPECT_EQ(first["object"], "text_completion");
  EXPECT_EQ(first["choices"][0]["text"], "a");
  EXPECT_EQ(first["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(first["choices"][0]["prompt_token_ids"], Json({256}));
  EXPECT_FALSE(first.contains("usage"));
}

TEST(OpenAiResponseTest, ErrorEventModelsAndHealth) {
  Json error = EventJson(ChunkBuilder::ErrorEvent(absl::UnavailableError("stage 2 is gone")));
  EXPECT_EQ(error["error"]["message"], "stage 2 is gone");
  EXPECT_EQ(error["error"]["type"], "server_error");

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
