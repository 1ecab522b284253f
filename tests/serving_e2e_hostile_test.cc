// Hostile, departing and too many clients end to end, at a stage 0 and at the resume proxy, on
// the fixture's deployment (started with connex-chaos's Cluster): oversized, half-sent and
// crowded requests get their 4xx or their answer, a connection that ends cancels its request on
// every stage, a stage 0 past its KV budget queues a bounded number and refuses the rest, and
// both keep answering exactly connex-generate's tokens (chaos::Check).
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "connex/base/wait.h"
#include "connex/serving/openai_stream.h"
#include "connex/serving/testing/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/serving_e2e_fixture.h"

namespace connex::testing {
namespace {

using serving::testing::TestConnection;
using ::testing::HasSubstr;

// The token ids of every chunk of a streamed body read so far, in order (a stream read in part),
// read with the serving stack's own stream reader.
std::vector<int32_t> StreamedTokens(const std::string& body) {
  std::vector<int32_t> tokens;
  serving::OpenAiStreamReader reader;
  reader.Feed(body);
  while (true) {
    absl::StatusOr<std::optional<serving::StreamEvent>> event = reader.Next();
    EXPECT_TRUE(event.ok()) << event.status();
    if (!event.ok() || !*event) break;
    EXPECT_NE((*event)->kind, serving::StreamEvent::Kind::kError) << (*event)->error_json;
    tokens.insert(tokens.end(), (*event)->token_ids.begin(), (*event)->token_ids.end());
  }
  return tokens;
}

// Issue 23: a completion followed by 16 KiB or more of further bytes made stage 0 (and the
// proxy) drop the connection unanswered while the generation ran on to max_tokens, its connection
// slot freed (600 of them left 536 generations running). Every end of a connection cancels its
// request on every stage: none of these runs to its end, and nothing is left held anywhere.
TEST_F(ServingE2eTest, AConnectionThatEndsAfterExtraBytesCancelsItsRequestOnEveryStage) {
  constexpr int kOrphans = 12;
  constexpr int kMaxTokens = 4000;
  for (uint16_t port : {http_port(0), proxy_port()}) {
    const std::string where = port == proxy_port() ? "proxy" : "stage 0";
    SCOPED_TRACE(where);
    const double accepted_before = StageZeroSum("connex_prompt_tokens_total");
    const double proxy_cancelled_before = ProxyMetric("connex_proxy_cancelled_total");
    const double completed_before = StageZeroSum("connex_request_success_total");
    const double generated_before = StageZeroSum("connex_generation_tokens_total");
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kOrphans; ++i) {
      TestConnection c(port, 30000);
      ASSERT_TRUE(c.Send("POST", "/v1/completions",
                         R"({"model": "tiny", "prompt": "orphan", "max_tokens": )" +
                             std::to_string(kMaxTokens) + "}"));
      ASSERT_TRUE(c.SendRaw(std::string(20 * 1024, 'x')));
      c.Close();
    }
    // Each request was taken: by a stage 0 ("orphan" is BOS and 6 bytes), or by the proxy, which
    // cancelled it when its client left (before or after its attempt reached a stage 0) ...
    if (port == proxy_port()) {
      ASSERT_TRUE(WaitUntil(
          [&] {
            return ProxyMetric("connex_proxy_cancelled_total") >= proxy_cancelled_before + kOrphans;
          },
          20000))
          << ProxyMetric("connex_proxy_cancelled_total") - proxy_cancelled_before;
    } else {
      ASSERT_TRUE(WaitUntil(
          [&] {
            return StageZeroSum("connex_prompt_tokens_total") >= accepted_before + 7 * kOrphans;
          },
          20000));
    }
    // ... and ended there and on every later stage.
    ASSERT_TRUE(WaitUntil(
        [&] {
          return StageZeroSum("connex_requests_running") == 0 && HeldAnywhere().empty() &&
                 ProxyMetric("connex_requests_running") == 0;
        },
        60000))
        << HeldAnywhere();
    const double generated = StageZeroSum("connex_generation_tokens_total") - generated_before;
    std::printf(
        "%s: %d requests whose clients left after 20 KiB more: all ended within %lld ms, "
        "%.0f of %d tokens generated\n",
        where.c_str(), kOrphans,
        static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count()),
        generated, kOrphans * kMaxTokens);
    EXPECT_EQ(StageZeroSum("connex_request_success_total"), completed_before)
        << "a request whose client had gone ran to its end";
    EXPECT_LT(generated, kOrphans * kMaxTokens / 2);
  }
}

// Hostile clients, at a stage 0 and at the proxy: a 100 MB body is a 413 before it is read, a
// client that sends half a request a 408, 200 connections at once are all answered; a client
// that goes away mid-stream is cancelled; afterwards nothing runs and both keep serving.
TEST_F(ServingE2eTest, HostileClientsGetA4xxAndBothTheStageAndTheProxyKeepServing) {
  for (uint16_t port : {http_port(0), proxy_port()}) {
    SCOPED_TRACE(port == proxy_port() ? "proxy" : "stage 0");
    {
      TestConnection c(port, 30000);
      ASSERT_TRUE(
          c.SendRaw("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    "Content-Type: application/json\r\nContent-Length: 104857600\r\n\r\n" +
                    std::string(64 * 1024, 'x')));
      auto r = c.Read();
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->result_int(), 413) << r->body();
      EXPECT_THAT(r->body(), HasSubstr("\"error\""));
    }
    {
      TestConnection c(port, 30000);
      ASSERT_TRUE(c.SendRaw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"));
      auto r = c.Read();  // the server's read timeout (2 s here) passes first
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->result_int(), 408) << r->body();
    }
    {
      TestConnection c(port, 30000);
      ASSERT_TRUE(c.Send("POST", "/v1/completions",
                         R"({"model": "tiny", "prompt": "gone", "max_tokens": 4000,
                             "stream": true})"));
      ASSERT_TRUE(c.ReadHead());
      ASSERT_TRUE(c.ReadUntil("token_ids"));
      c.Close();
    }
    std::vector<std::unique_ptr<TestConnection>> crowd;
    for (int i = 0; i < 200; ++i) {
      crowd.push_back(std::make_unique<TestConnection>(port, 120000));
      ASSERT_TRUE(crowd.back()->Send("POST", "/v1/completions",
                                     R"({"model": "tiny", "prompt": "crowd )" +
                                         std::to_string(i % 7) + R"(", "max_tokens": 2})"));
    }
    int ok = 0;
    for (int i = 0; i < 200; ++i) {
      auto r = crowd[i]->Read();
      ASSERT_TRUE(r.has_value()) << "connection " << i << " got no answer";
      EXPECT_EQ(r->result_int(), 200) << r->body();
      ok += r->result_int() == 200;
    }
    EXPECT_EQ(ok, 200);
  }
  // Nothing runs any more on either stage 0 (the cancelled stream included) ...
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WaitUntil(
        [&] {
          return Get(r, "/metrics").second.find("connex_requests_running 0") != std::string::npos;
        },
        20000))
        << Get(r, "/metrics").second;
  }
  EXPECT_EQ(ProxyMetric("connex_requests_running"), 0.0);
  EXPECT_TRUE(WaitUntil([&] { return HeldAnywhere().empty(); }, 20000)) << HeldAnywhere();
  // ... and both still answer exactly.
  const chaos::RequestSpec still{.prompt = "still here", .max_tokens = 8};
  auto [status, body] = Request(0, "POST", "/v1/completions",
                                R"({"model": "tiny", "prompt": "still here", "max_tokens": 8})");
  ASSERT_EQ(status, 200) << body;
  TestConnection c(proxy_port(), 60000);
  ASSERT_TRUE(c.Send("POST", "/v1/completions",
                     R"({"model": "tiny", "prompt": "still here", "max_tokens": 8})"));
  auto r = c.Read();
  ASSERT_TRUE(r.has_value());
  ExpectCorrect({WholeOutcome(still, "replica 0", status, body),
                 WholeOutcome(still, "proxy", r->result_int(), r->body())});
}

// Issue 23: the only cap was 512 connections, and Submit held the HTTP threads behind a long
// prefill so that /health and /metrics stalled. Stage 0 admits what fits its KV budget, queues a
// bounded number more (they start as room frees, with exactly their tokens), answers 429 with
// Retry-After past that, and /health answers throughout.
TEST_F(ServingE2eTest, StageZeroAdmitsWhatFitsItsKvBudgetQueuesABoundedNumberAndRefusesTheRest) {
  // 1 MiB of KV: two requests of 2,000 tokens on this model (256 bytes a token on a stage).
  ASSERT_TRUE(cluster().Kill(0, 0).ok());
  absl::Status restarted =
      cluster().Restart(0, 0, {"CONNEX_STAGE_KV_BUDGET_BYTES=1M", "CONNEX_STAGE_QUEUE_MAX=2"});
  ASSERT_TRUE(restarted.ok()) << restarted;
  ASSERT_TRUE(WaitUntil([&] { return Get(0, "/health").first == 200; }, 20000));
  constexpr int kMaxTokens = 2000;
  struct Stream {
    std::string prompt;
    std::unique_ptr<TestConnection> c;
    int status = 0;
  };
  std::vector<Stream> streams;
  for (int i = 0; i < 6; ++i) {
    Stream s{"admit " + std::to_string(i), std::make_unique<TestConnection>(http_port(0), 60000)};
    ASSERT_TRUE(s.c->Send("POST", "/v1/completions",
                          R"({"model": "tiny", "prompt": ")" + s.prompt + R"(", "max_tokens": )" +
                              std::to_string(kMaxTokens) + R"(, "stream": true})"));
    ASSERT_TRUE(s.c->ReadHead());
    s.status = static_cast<int>(s.c->parser().get().result_int());
    streams.push_back(std::move(s));
  }
  // Two run, two wait (their streams are open), two are refused with Retry-After.
  int refused = 0;
  for (auto& s : streams) {
    if (s.status != 429) continue;
    ++refused;
    EXPECT_EQ(s.c->parser().get()["Retry-After"], "1");
    ASSERT_TRUE(s.c->ReadToEnd());
    EXPECT_THAT(s.c->parser().get().body(), HasSubstr("rate_limit_exceeded"));
  }
  EXPECT_EQ(refused, 2);
  EXPECT_EQ(streams[0].status, 200);
  EXPECT_EQ(streams[3].status, 200);
  ASSERT_TRUE(streams[0].c->ReadUntil("token_ids"));
  ASSERT_TRUE(streams[1].c->ReadUntil("token_ids"));
  // /health and /metrics answer at once while the budget is full.
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(Get(0, "/health").first, 200);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    if (i == 19)
      std::printf("/health under a full KV budget: %lld ms\n", static_cast<long long>(ms));
  }
  EXPECT_EQ(MetricSum(http_port(0), "connex_requests_queued"), 2);
  EXPECT_EQ(MetricSum(http_port(0), "connex_requests_refused_total"), 2);
  // The running two leave: the queued two start, with exactly their tokens.
  streams[0].c->Close();
  streams[1].c->Close();
  for (int i : {2, 3}) {
    ASSERT_TRUE(streams[i].c->ReadUntil("token_ids")) << streams[i].prompt;
    ASSERT_TRUE(WaitUntil(
        [&] {
          if (!streams[i].c->ReadSome()) return true;  // ended: checked below
          return StreamedTokens(streams[i].c->parser().get().body()).size() >= 8;
        },
        20000));
    std::vector<int32_t> tokens = StreamedTokens(streams[i].c->parser().get().body());
    tokens.resize(8);
    EXPECT_EQ(tokens, Want({.prompt = streams[i].prompt, .max_tokens = 8}).tokens)
        << streams[i].prompt;
    streams[i].c->Close();
  }
  EXPECT_TRUE(
      WaitUntil([&] { return MetricSum(http_port(0), "connex_requests_running") == 0; }, 20000));
  EXPECT_EQ(MetricSum(http_port(0), "connex_stage_kv_budget_used_bytes"), 0);
}

}  // namespace
}  // namespace connex::testing
