#include "connex/serving/openai_stream.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The JSON of one SSE event `data: {...}\n\n`.
Json EventJson(const std::string& event) {
  EXPECT_THAT(event, StartsWith("data: "));
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n");
  std::string payload = event.substr(6, event.size() - 8);
  EXPECT_EQ(payload.find('\n'), std::string::npos);
  return Json::parse(payload);
}

ResponseHeader StreamHeader(Endpoint endpoint) {
  return ResponseHeader{endpoint, MakeResponseId(endpoint, 0xabc), 1700000000, "tiny"};
}

// Every event data `reader` has whole now; fails the test on an error.
std::vector<std::string> Drain(SseReader& reader) {
  std::vector<std::string> out;
  while (true) {
    absl::StatusOr<std::optional<std::string>> data = reader.Next();
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok() || !*data) return out;
    out.push_back(**data);
  }
}

TEST(ChunkBuilderTest, ChatStreamChunks) {
  ChunkBuilder chunks(StreamHeader(Endpoint::kChatCompletions), /*include_usage=*/true);
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

TEST(ChunkBuilderTest, CompletionStreamChunksWithoutUsage) {
  ChunkBuilder chunks(StreamHeader(Endpoint::kCompletions), /*include_usage=*/false);
  Json first = EventJson(chunks.Delta("a", std::vector<int32_t>{97}, std::vector<int32_t>{256},
                                      FinishReason::kLength));
  EXPECT_EQ(first["object"], "text_completion");
  EXPECT_EQ(first["choices"][0]["text"], "a");
  EXPECT_EQ(first["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(first["choices"][0]["prompt_token_ids"], Json({256}));
  EXPECT_FALSE(first.contains("usage"));
}

TEST(ChunkBuilderTest, TheEndsOfAStream) {
  ChunkBuilder with_usage(StreamHeader(Endpoint::kCompletions), /*include_usage=*/true);
  EXPECT_FALSE(with_usage.started());
  with_usage.Delta("a", std::vector<int32_t>{97}, std::vector<int32_t>{256});
  EXPECT_TRUE(with_usage.started());
  EXPECT_EQ(with_usage.End({1, 1}), with_usage.UsageChunk({1, 1}) + std::string(kSseDone));
  ChunkBuilder without(StreamHeader(Endpoint::kCompletions), /*include_usage=*/false);
  EXPECT_EQ(without.End({1, 1}), kSseDone);

  Json error = EventJson(ChunkBuilder::ErrorEvent(absl::UnavailableError("stage 2 is gone")));
  EXPECT_EQ(error["error"]["message"], "stage 2 is gone");
  EXPECT_EQ(error["error"]["type"], "server_error");
  EXPECT_EQ(
      ChunkBuilder::ErrorEnd(absl::UnavailableError("stage 2 is gone")),
      ChunkBuilder::ErrorEvent(absl::UnavailableError("stage 2 is gone")) + std::string(kSseDone));
  // A replica's envelope goes on as it came (compacted); what is not one is quoted.
  EXPECT_EQ(ChunkBuilder::ErrorEnd(std::string_view(R"({"error": {"message": "bad"}})")),
            "data: {\"error\":{\"message\":\"bad\"}}\n\ndata: [DONE]\n\n");
  std::string junk = ChunkBuilder::ErrorEnd(std::string_view("<html>"));
  EXPECT_THAT(junk, HasSubstr("\"message\":\"<html>\""));
  EXPECT_THAT(junk, HasSubstr("server_error"));
}

TEST(SseReaderTest, AnEventSplitAnywhereIsReadWhole) {
  const std::string stream = "data: {\"a\":1}\n\ndata: [DONE]\n\n";
  SseReader reader;
  std::vector<std::string> events;
  for (char c : stream) {
    reader.Feed(std::string_view(&c, 1));
    for (std::string& e : Drain(reader)) events.push_back(std::move(e));
  }
  EXPECT_THAT(events, ElementsAre("{\"a\":1}", "[DONE]"));
  EXPECT_EQ(reader.buffered(), 0u);
}

TEST(SseReaderTest, SeveralEventsInOneRead) {
  SseReader reader;
  reader.Feed("data: one\n\ndata:two\n\ndata: thr");
  EXPECT_THAT(Drain(reader), ElementsAre("one", "two"));
  reader.Feed("ee\n\n");
  EXPECT_THAT(Drain(reader), ElementsAre("three"));
}

TEST(SseReaderTest, CommentsOtherFieldsCrLfAndMultiLineData) {
  SseReader reader;
  reader.Feed(
      ": keep-alive\n\n"                          // a comment alone is no event
      "event: message\r\nid: 7\r\nretry: 10\r\n"  // fields that are not data are skipped
      "data: {\"x\":\r\ndata:  1}\r\n\r\n"        // data lines are joined with \n
      "data\n\n");                                // a field with no colon: empty data
  EXPECT_THAT(Drain(reader), ElementsAre("{\"x\":\n 1}", ""));
}

TEST(SseReaderTest, AnEventOverTheBoundIsDataLossForGood) {
  SseReader reader(/*max_event_bytes=*/16);
  reader.Feed("data: 0123456789");
  EXPECT_THAT(Drain(reader), ElementsAre());
  reader.Feed("0123456789");
  absl::StatusOr<std::optional<std::string>> next = reader.Next();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(next.status().message(), HasSubstr("an event over 16 bytes"));
  reader.Feed("\n\ndata: x\n\n");
  EXPECT_EQ(reader.Next().status().code(), absl::StatusCode::kDataLoss);
}

TEST(ParseStreamEventTest, ChunksUsageDoneAndErrors) {
  auto chunk = ParseStreamEvent(
      R"({"id":"cmpl-1","choices":[{"text":"ab","token_ids":[5,6],"prompt_token_ids":[1],"finish_reason":"stop"}]})");
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(chunk->kind, StreamEvent::Kind::kChunk);
  EXPECT_EQ(chunk->id, "cmpl-1");
  EXPECT_EQ(chunk->text, "ab");
  EXPECT_THAT(chunk->token_ids, ElementsAre(5, 6));
  EXPECT_THAT(chunk->prompt_token_ids, ElementsAre(1));
  EXPECT_EQ(chunk->finish, FinishReason::kStop);
  EXPECT_EQ(chunk->total_tokens, -1);
  auto delta = ParseStreamEvent(R"({"choices":[{"delta":{"content":"x"},"finish_reason":null}]})");
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(delta->text, "x");
  EXPECT_EQ(delta->finish, std::nullopt);
  auto usage = ParseStreamEvent(
      R"({"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}})");
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->kind, StreamEvent::Kind::kUsage);
  EXPECT_EQ(usage->prompt_tokens, 1);
  EXPECT_EQ(usage->completion_tokens, 2);
  EXPECT_EQ(usage->total_tokens, 3);
  auto done = ParseStreamEvent("[DONE]");
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->kind, StreamEvent::Kind::kDone);
  auto server = ParseStreamEvent(R"({"error":{"message":"drained","type":"server_error"}})");
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(server->kind, StreamEvent::Kind::kError);
  EXPECT_TRUE(server->server_error);
  EXPECT_EQ(server->error_message, "drained");
  auto client = ParseStreamEvent(R"({"error":{"message":"bad","type":"invalid_request_error"}})");
  ASSERT_TRUE(client.ok());
  EXPECT_FALSE(client->server_error);
}

TEST(ParseStreamEventTest, ABrokenEventIsDataLossNamingWhatIsWrong) {
  auto junk = ParseStreamEvent("not json at all");
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(junk.status().message(), HasSubstr("not a JSON object: not json at all"));
  EXPECT_THAT(ParseStreamEvent(R"({"id":1})").status().message(), HasSubstr("without choices"));
  EXPECT_THAT(ParseStreamEvent(R"({"choices":[3]})").status().message(),
              HasSubstr("not an object"));
  EXPECT_THAT(
      ParseStreamEvent(R"({"choices":[{"finish_reason":"tool_calls"}]})").status().message(),
      HasSubstr("finish_reason other than stop or length: \"tool_calls\""));
}

TEST(OpenAiStreamReaderTest, WhatTheWriterWritesIsReadBack) {
  ChunkBuilder chunks(StreamHeader(Endpoint::kChatCompletions), /*include_usage=*/true);
  const std::vector<int32_t> prompt = {256, 72};
  std::string stream = chunks.Delta("He", std::vector<int32_t>{72, 101}, prompt);
  stream += chunks.Delta("y", std::vector<int32_t>{121}, prompt, FinishReason::kLength);
  stream += chunks.End({2, 3});
  OpenAiStreamReader reader;
  std::vector<StreamEvent> events;
  // In two reads that split the second event.
  const size_t half = stream.size() / 2;
  for (std::string_view piece :
       {std::string_view(stream).substr(0, half), std::string_view(stream).substr(half)}) {
    reader.Feed(piece);
    while (true) {
      auto next = reader.Next();
      ASSERT_TRUE(next.ok()) << next.status();
      if (!*next) break;
      events.push_back(**next);
    }
  }
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].text, "He");
  EXPECT_THAT(events[0].prompt_token_ids, ElementsAre(256, 72));
  EXPECT_EQ(events[0].id, "chatcmpl-0000000000000abc");
  EXPECT_THAT(events[1].token_ids, ElementsAre(121));
  EXPECT_EQ(events[1].finish, FinishReason::kLength);
  EXPECT_EQ(events[2].kind, StreamEvent::Kind::kUsage);
  EXPECT_EQ(events[2].total_tokens, 5);
  EXPECT_EQ(events[3].kind, StreamEvent::Kind::kDone);
  EXPECT_TRUE(reader.done());
  EXPECT_EQ(reader.events(), 4);
}

TEST(OpenAiStreamReaderTest, AMalformedLineIsNamedAndTheReaderGoesOn) {
  OpenAiStreamReader reader;
  reader.Feed("data: {\"choices\":[]}\n\ndata: {\"choices\": [tru\n\ndata: [DONE]\n\n");
  auto first = reader.Next();
  ASSERT_TRUE(first.ok() && *first);
  EXPECT_EQ((*first)->kind, StreamEvent::Kind::kUsage);
  auto bad = reader.Next();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(bad.status().message(),
            "event 2: an event that is not a JSON object: {\"choices\": [tru");
  EXPECT_FALSE(reader.done());
  auto done = reader.Next();
  ASSERT_TRUE(done.ok() && *done);
  EXPECT_EQ((*done)->kind, StreamEvent::Kind::kDone);
  EXPECT_TRUE(reader.done());
  auto nothing = reader.Next();
  ASSERT_TRUE(nothing.ok());
  EXPECT_FALSE(*nothing);
}

}  // namespace
}  // namespace connex::serving
