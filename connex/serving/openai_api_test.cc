#include "connex/serving/openai_api.h"

#include <string>

#include "connex/serving/api_error.h"
#include "connex/serving/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace connex::serving {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

RequestLimits Limits() {
  RequestLimits limits;
  limits.models = {"tiny"};
  return limits;
}

absl::StatusOr<CompletionRequest> Completions(const std::string& body) {
  return ParseCompletionRequest(Endpoint::kCompletions, body, Limits());
}
absl::StatusOr<CompletionRequest> Chat(const std::string& body) {
  return ParseCompletionRequest(Endpoint::kChatCompletions, body, Limits());
}

// Expects a refusal with `http_status` naming `param` with `code`.
void ExpectRefused(const absl::StatusOr<CompletionRequest>& result, int http_status,
                   const std::string& param, const std::string& code) {
  ASSERT_FALSE(result.ok()) << "accepted, expected a refusal naming " << param;
  EXPECT_EQ(HttpStatusOf(result.status()), http_status) << result.status();
  EXPECT_EQ(ApiParam(result.status()).value_or("<none>"), param) << result.status();
  EXPECT_EQ(ApiCode(result.status()).value_or("<none>"), code) << result.status();
}

TEST(OpenAiApiTest, CompletionDefaultsAndFields) {
  absl::StatusOr<CompletionRequest> r = Completions(R"({"model": "tiny", "prompt": "Hello"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "tiny");
  EXPECT_EQ(r->prompt_text, "Hello");
  EXPECT_EQ(r->max_tokens, 16);
  EXPECT_FALSE(r->stream);
  // Absent sampling fields stay absent: the server that runs the request gives them its defaults
  // (SamplingDefaults: greedy, or the model's generation_config.json).
  EXPECT_FALSE(r->temperature.has_value());
  EXPECT_FALSE(r->top_p.has_value());
  EXPECT_FALSE(r->top_k.has_value());
  EXPECT_FALSE(r->seed.has_value());

  r = Completions(R"({"model": "tiny", "prompt": "x", "max_tokens": 7, "stream": true,
      "stream_options": {"include_usage": true}, "stop": ["\n", "END"], "seed": 42,
      "temperature": 0.7, "top_p": 0.9, "top_k": 40, "n": 1, "user": "alice",
      "best_of": 1, "echo": false, "logprobs": null, "frequency_penalty": 0,
      "some_unknown_field": {"nested": [1, 2]}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_tokens, 7);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_THAT(r->stop, ElementsAre("\n", "END"));
  EXPECT_EQ(r->seed, 42u);
  EXPECT_DOUBLE_EQ(r->temperature.value_or(-1), 0.7);
  EXPECT_DOUBLE_EQ(r->top_p.value_or(-1), 0.9);
  EXPECT_EQ(r->top_k, 40);

  r = Completions(R"({"model": "tiny", "prompt": "x", "stop": "###", "seed": -1})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->stop, ElementsAre("###"));
  EXPECT_EQ(r->seed, ~uint64_t{0});  // modulo 2^64
}

TEST(OpenAiApiTest, PromptForms) {
  absl::StatusOr<CompletionRequest> r = Completions(R"({"model": "tiny", "prompt": ["one"]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_text, "one");

  r = Completions(R"({"model": "tiny", "prompt": [256, 72, 105]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->prompt_text.has_value());
  EXPECT_THAT(r->prompt_token_ids, ElementsAre(256, 72, 105));

  r = Completions(R"({"model": "tiny", "prompt": [[256, 72]]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->prompt_token_ids, ElementsAre(256, 72));

  ExpectRefused(Completions(R"({"model": "tiny", "prompt": ["a", "b"]})"), 400, "prompt",
                "unsupported_value");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": [[1], [2]]})"), 400, "prompt",
                "unsupported_value");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": []})"), 400, "prompt", "invalid_value");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": [[]]})"), 400, "prompt",
                "invalid_value");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": [1, "a"]})"), 400, "prompt",
                "invalid_type");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": [258]})"), 400, "prompt",
                "invalid_value");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": [-1]})"), 400, "prompt",
                "invalid_value");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": [18446744073709551615]})"), 400,
                "prompt", "invalid_value");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": 5})"), 400, "prompt", "invalid_type");
  ExpectRefused(Completions(R"({"model": "tiny"})"), 400, "prompt", "missing_required_parameter");
  ExpectRefused(Completions(R"({"model": "tiny", "prompt": null})"), 400, "prompt",
                "missing_required_parameter");
}

TEST(OpenAiApiTest, MalformedBodiesAndModel) {
  absl::StatusOr<CompletionRequest> r = Completions(R"({"model": "tiny", "prompt": )");
  ExpectRefused(r, 400, "", "invalid_json");
  EXPECT_THAT(r.status().message(), HasSubstr("not valid JSON"));
  ExpectRefused(Completions(""), 400, "", "invalid_json");
  ExpectRefused(Completions("[1, 2]"), 400, "", "invalid_type");
  ExpectRefused(Completions(std::string(100, '[') + std::string(100, ']')), 400, "",
                "invalid_json");
  ExpectRefused(Completions(R"({"prompt": "x"})"), 400, "model", "missing_required_parameter");
  ExpectRefused(Completions(R"({"model": 3, "prompt": "x"})"), 400, "model", "invalid_type");
  r = Completions(R"({"model": "huge", "prompt": "x"})");
  ExpectRefused(r, 404, "model", "model_not_found");
  EXPECT_THAT(r.status().message(), HasSubstr("'huge'"));
  // A malformed request is a 400 whatever model it names.
  ExpectRefused(Completions(R"({"model": "huge", "prompt": 1})"), 400, "prompt", "invalid_type");
  // Any model is accepted when the limits list none.
  EXPECT_TRUE(
      ParseCompletionRequest(Endpoint::kCompletions, R"({"model": "x", "prompt": ""})", {}).ok());
}

TEST(OpenAiApiTest, RangesAndTypes) {
  auto with = [](const std::string& field) {
    return Completions(R"({"model": "tiny", "prompt": "x", )" + field + "}");
  };
  ExpectRefused(with(R"("max_tokens": 0)"), 400, "max_tokens", "invalid_value");
  ExpectRefused(with(R"("max_tokens": 1.5)"), 400, "max_tokens", "invalid_type");
  ExpectRefused(with(R"("max_tokens": "16")"), 400, "max_tokens", "invalid_type");
  ExpectRefused(with(R"("max_tokens": 99999999999999999999)"), 400, "max_tokens", "invalid_type");
  ExpectRefused(with(R"("temperature": 2.5)"), 400, "temperature", "invalid_value");
  ExpectRefused(with(R"("temperature": -0.1)"), 400, "temperature", "invalid_value");
  ExpectRefused(with(R"("temperature": "hot")"), 400, "temperature", "invalid_type");
  EXPECT_TRUE(with(R"("temperature": 2)").ok());
  ExpectRefused(with(R"("top_p": 0)"), 400, "top_p", "invalid_value");
  ExpectRefused(with(R"("top_p": 1.01)"), 400, "top_p", "invalid_value");
  EXPECT_TRUE(with(R"("top_p": 1)").ok());
  ExpectRefused(with(R"("top_k": -2)"), 400, "top_k", "invalid_value");
  EXPECT_TRUE(with(R"("top_k": 0)").ok());
  ExpectRefused(with(R"("seed": 1.5)"), 400, "seed", "invalid_type");
  ExpectRefused(with(R"("stream": "yes")"), 400, "stream", "invalid_type");
  ExpectRefused(with(R"("stream_options": {"include_usage": true})"), 400, "stream_options",
                "invalid_value");
  ExpectRefused(with(R"("stream": true, "stream_options": {"include_usage": 1})"), 400,
                "stream_options.include_usage", "invalid_type");
  ExpectRefused(with(R"("stop": ["a", "b", "c", "d", "e"])"), 400, "stop", "invalid_value");
  ExpectRefused(with(R"("stop": [""])"), 400, "stop", "invalid_value");
  ExpectRefused(with(R"("stop": [1])"), 400, "stop", "invalid_type");
  ExpectRefused(with(R"("stop": ")" + std::string(257, 'x') + "\""), 400, "stop", "invalid_value");
  ExpectRefused(with(R"("user": 7)"), 400, "user", "invalid_type");
  RequestLimits limits = Limits();
  limits.max_tokens_limit = 100;
  absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(
      Endpoint::kCompletions, R"({"model": "tiny", "prompt": "x", "max_tokens": 101})", limits);
  ExpectRefused(r, 400, "max_tokens", "invalid_value");
  EXPECT_THAT(r.status().message(), HasSubstr("[1, 100]"));
}

// vLLM's sampling and stopping extensions, on both endpoints.
TEST(OpenAiApiTest, VllmSamplingAndStoppingFields) {
  absl::StatusOr<CompletionRequest> r = Completions(R"({"model": "tiny", "prompt": "x"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->min_p.has_value());
  EXPECT_FALSE(r->repetition_penalty.has_value());
  EXPECT_FALSE(r->ignore_eos);
  EXPECT_TRUE(r->stop_token_ids.empty());
  for (Endpoint e : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const std::string input = e == Endpoint::kCompletions
                                  ? R"("prompt": [256, 72])"
                                  : R"("messages": [{"role": "user", "content": "Hi"}])";
    r = ParseCompletionRequest(e, R"({"model": "tiny", )" + input + R"(, "min_p": 0.05,
        "repetition_penalty": 1.3, "ignore_eos": true, "stop_token_ids": [10, 257]})",
                               Limits());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_DOUBLE_EQ(r->min_p.value_or(-1), 0.05);
    EXPECT_DOUBLE_EQ(r->repetition_penalty.value_or(-1), 1.3);
    EXPECT_TRUE(r->ignore_eos);
    EXPECT_THAT(r->stop_token_ids, ElementsAre(10, 257));
  }
  r = Completions(R"({"model": "tiny", "prompt": "x", "min_p": null, "stop_token_ids": [],
                      "ignore_eos": null, "repetition_penalty": null})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->repetition_penalty.has_value());  // null is absent
  EXPECT_TRUE(r->stop_token_ids.empty());
}

TEST(OpenAiApiTest, BadVllmFieldsAreRefusedNamingTheFieldAndTheValue) {
  auto with = [](const std::string& field) {
    return Completions(R"({"model": "tiny", "prompt": "x", )" + field + "}");
  };
  absl::StatusOr<CompletionRequest> r = with(R"("min_p": 1.5)");
  ExpectRefused(r, 400, "min_p", "invalid_value");
  EXPECT_THAT(r.status().message(), HasSubstr("'min_p' must be in [0, 1], got 1.5"));
  ExpectRefused(with(R"("min_p": -0.1)"), 400, "min_p", "invalid_value");
  ExpectRefused(with(R"("min_p": "low")"), 400, "min_p", "invalid_type");
  EXPECT_TRUE(with(R"("min_p": 1)").ok());
  r = with(R"("repetition_penalty": 0)");
  ExpectRefused(r, 400, "repetition_penalty", "invalid_value");
  EXPECT_THAT(r.status().message(), HasSubstr("got 0"));
  ExpectRefused(with(R"("repetition_penalty": -1.2)"), 400, "repetition_penalty", "invalid_value");
  ExpectRefused(with(R"("repetition_penalty": 1e300)"), 400, "repetition_penalty", "invalid_value");
  ExpectRefused(with(R"("repetition_penalty": [1])"), 400, "repetition_penalty", "invalid_type");
  EXPECT_TRUE(with(R"("repetition_penalty": 0.5)").ok());
  ExpectRefused(with(R"("ignore_eos": 1)"), 400, "ignore_eos", "invalid_type");
  ExpectRefused(with(R"("stop_token_ids": 10)"), 400, "stop_token_ids", "invalid_type");
  ExpectRefused(with(R"("stop_token_ids": ["10"])"), 400, "stop_token_ids", "invalid_type");
  r = with(R"("stop_token_ids": [10, 258])");
  ExpectRefused(r, 400, "stop_token_ids", "invalid_value");
  EXPECT_THAT(r.status().message(), HasSubstr("258 outside the vocabulary [0, 258)"));
  ExpectRefused(with(R"("stop_token_ids": [-1])"), 400, "stop_token_ids", "invalid_value");
  // The penalties vLLM and OpenAI define besides repetition_penalty stay refused.
  ExpectRefused(with(R"("presence_penalty": 0.5)"), 400, "presence_penalty",
                "unsupported_parameter");
}

TEST(OpenAiApiTest, RefusesUnsupportedParameters) {
  auto with = [](const std::string& field) {
    return Completions(R"({"model": "tiny", "prompt": "x", )" + field + "}");
  };
  ExpectRefused(with(R"("n": 2)"), 400, "n", "unsupported_value");
  ExpectRefused(with(R"("n": true)"), 400, "n", "invalid_type");
  ExpectRefused(with(R"("best_of": 3)"), 400, "best_of", "unsupported_value");
  ExpectRefused(with(R"("logprobs": 5)"), 400, "logprobs", "unsupported_parameter");
  ExpectRefused(with(R"("echo": true)"), 400, "echo", "unsupported_parameter");
  ExpectRefused(with(R"("logit_bias": {"50256": -100})"), 400, "logit_bias",
                "unsupported_parameter");
  ExpectRefused(with(R"("suffix": "end")"), 400, "suffix", "unsupported_parameter");
  ExpectRefused(with(R"("presence_penalty": 0.5)"), 400, "presence_penalty",
                "unsupported_parameter");
  absl::StatusOr<CompletionRequest> r = Chat(
      R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
          "tools": [{"type": "function"}]})");
  ExpectRefused(r, 400, "tools", "unsupported_parameter");
  EXPECT_THAT(r.status().message(), HasSubstr("not supported"));
  ExpectRefused(Chat(R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                         "response_format": {"type": "json_object"}})"),
                400, "response_format", "unsupported_value");
  EXPECT_TRUE(Chat(R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                       "response_format": {"type": "text"}, "logprobs": false})")
                  .ok());
}

TEST(OpenAiApiTest, ChatMessages) {
  absl::StatusOr<CompletionRequest> r = Chat(R"({"model": "tiny", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": "Hello.", "name": "bot"}],
      "max_tokens": 5, "max_completion_tokens": 9})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "Hi there");
  EXPECT_EQ(r->messages[2].role, "assistant");
  EXPECT_EQ(r->max_tokens, 9);  // max_completion_tokens wins

  ExpectRefused(Chat(R"({"model": "tiny"})"), 400, "messages", "missing_required_parameter");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": []})"), 400, "messages", "invalid_value");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": {"role": "user"}})"), 400, "messages",
                "invalid_type");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": ["hi"]})"), 400, "messages[0]",
                "invalid_type");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": [{"content": "hi"}]})"), 400,
                "messages[0].role", "missing_required_parameter");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": [{"role": "user", "content": "a"},
                                                       {"role": "tool", "content": "b"}]})"),
                400, "messages[1].role", "unsupported_value");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": [{"role": "user"}]})"), 400,
                "messages[0].content", "missing_required_parameter");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": [{"role": "user", "content": 3}]})"), 400,
                "messages[0].content", "invalid_type");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": [{"role": "user", "content":
                         [{"type": "image_url", "image_url": {"url": "x"}}]}]})"),
                400, "messages[0].content", "unsupported_value");
  ExpectRefused(Chat(R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                         "max_completion_tokens": 0})"),
                400, "max_completion_tokens", "invalid_value");
}

TEST(OpenAiApiTest, ErrorEnvelopeNamesTheField) {
  absl::Status status = Completions(R"({"model": "tiny", "prompt": "x", "top_p": 7})").status();
  nlohmann::json envelope = nlohmann::json::parse(ErrorEnvelope(status));
  EXPECT_EQ(envelope["error"]["type"], "invalid_request_error");
  EXPECT_EQ(envelope["error"]["param"], "top_p");
  EXPECT_EQ(envelope["error"]["code"], "invalid_value");
  EXPECT_THAT(envelope["error"]["message"].get<std::string>(),
              HasSubstr("'top_p' must be in (0, 1]"));
  envelope = nlohmann::json::parse(ErrorEnvelope(absl::InternalError("boom")));
  EXPECT_EQ(envelope["error"]["type"], "server_error");
  EXPECT_TRUE(envelope["error"]["param"].is_null());
  EXPECT_TRUE(envelope["error"]["code"].is_null());
  EXPECT_EQ(HttpStatusOf(absl::UnavailableError("x")), 503);
}

// /tokenize and /detokenize in vLLM's shape: a prompt (special tokens added by default) or a chat
// (the template's BOS only, by default), token ids in the vocabulary; refusals name the field.
TEST(OpenAiApiTest, TokenizeAndDetokenizeBodies) {
  absl::StatusOr<TokenizeRequest> t = ParseTokenizeRequest(R"({"prompt": "Hi"})", Limits());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->prompt, "Hi");
  EXPECT_TRUE(t->add_special_tokens);
  EXPECT_FALSE(t->return_token_strs);
  t = ParseTokenizeRequest(
      R"({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
          {"type": "text", "text": "b"}]}], "add_generation_prompt": false,
          "return_token_strs": true})",
      Limits());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->prompt.has_value());
  ASSERT_EQ(t->messages.size(), 1u);
  EXPECT_EQ(t->messages[0].content, "ab");
  EXPECT_FALSE(t->add_special_tokens);
  EXPECT_FALSE(t->add_generation_prompt);
  EXPECT_TRUE(t->return_token_strs);
  auto refused = [](const std::string& body, int http, const std::string& param) {
    absl::Status s = ParseTokenizeRequest(body, Limits()).status();
    EXPECT_EQ(HttpStatusOf(s), http) << body << ": " << s;
    EXPECT_EQ(ApiParam(s).value_or("<none>"), param) << body << ": " << s;
  };
  refused(R"({})", 400, "prompt");
  refused(R"({"prompt": "a", "messages": []})", 400, "messages");
  refused(R"({"prompt": ["a"]})", 400, "prompt");
  refused(R"({"messages": [{"role": "tool", "content": "x"}]})", 400, "messages[0].role");
  refused(R"({"prompt": "a", "add_special_tokens": "yes"})", 400, "add_special_tokens");
  refused(R"({"prompt": "a", "model": "other"})", 404, "model");

  absl::StatusOr<std::vector<int32_t>> d =
      ParseDetokenizeRequest(R"({"tokens": [72, 105]})", Limits());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(*d, ElementsAre(72, 105));
  d = ParseDetokenizeRequest(R"({"tokens": []})", Limits());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->empty());
  for (const char* body : {R"({})", R"({"tokens": [258]})", R"({"tokens": [-1]})",
                           R"({"tokens": "72"})", R"({"tokens": [1.5]})"}) {
    absl::Status s = ParseDetokenizeRequest(body, Limits()).status();
    EXPECT_EQ(HttpStatusOf(s), 400) << body << ": " << s;
    EXPECT_EQ(ApiParam(s).value_or("<none>"), "tokens") << body << ": " << s;
  }
}

TEST(ChatTemplateTest, RendersTurnsAndOpensTheAssistantTurn) {
  std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(RenderChatPrompt(messages), "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
  messages.push_back({"assistant", "Hello."});
  messages.push_back({"user", "More"});
  EXPECT_EQ(RenderChatPrompt(messages),
            "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello.\n<|user|>\nMore\n"
            "<|assistant|>\n");
}

}  // namespace
}  // namespace connex::serving
