// OpenAiServer: the OpenAI-compatible HTTP API of a stage-0 process. Every completion is a
// request of the stage's StageNode (the owner), streamed as its tokens arrive — through
// failovers, which never change a token — and every client that goes away cancels its request,
// whose state is then released on every stage. Routes: POST /v1/completions and
// /v1/chat/completions (docs/serving.md), POST /tokenize and /detokenize (vLLM's), GET /v1/models,
// GET /health (503 until every stage of the pipeline has a live replica), GET /metrics
// (Prometheus). Prompts are tokenized, and generated ids decoded, with the model's tokenizer and
// chat template (ModelText). Thread-safe; the HTTP server's
// handler threads and the node's loop call into it.
#ifndef CONNEX_SERVING_OPENAI_SERVER_H_
#define CONNEX_SERVING_OPENAI_SERVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "connex/base/mutex.h"
#include "connex/engine/model_config.h"
#include "connex/serving/http_server.h"
#include "connex/serving/metrics.h"
#include "connex/serving/model_text.h"
#include "connex/serving/openai_api.h"
#include "connex/serving/router.h"
#include "connex/serving/stage.h"

namespace connex::serving {

struct OpenAiServerOptions {
  HttpServerOptions http;
  int64_t default_max_tokens = 16;  // CONNEX_DEFAULT_MAX_TOKENS: `max_tokens` when none is given
  // Admission: the KV cache each stage may hold for the requests admitted here, in bytes (a
  // request costs (prompt + max_tokens) x the KV bytes per token of the pipeline's largest stage,
  // its whole context, from admission to its end), and how many requests past it wait for room.
  // Past both a request is answered 429 with Retry-After (connex-proxy tries another replica).
  int64_t kv_budget_bytes = int64_t{1} << 30;  // CONNEX_STAGE_KV_BUDGET_BYTES
  int64_t queue_max = 64;                      // CONNEX_STAGE_QUEUE_MAX
  // A stream that sent nothing this long gets an SSE comment (": keep-alive") while the node's
  // loop turns — while the request waits in the queue, or for a stage behind stage 0 (a long
  // prefill there, a failover) — so that connex-proxy's idle timeout (keep it several times
  // this) takes only a hung or stopped stage 0 as dead. 0: none.
  // CONNEX_STAGE_STREAM_KEEPALIVE_MS.
  int64_t stream_keepalive_ms = 250;
  // --chat-template (CONNEX_CHAT_TEMPLATE): a template file that overrides the model's own
  // (tokenizer_config.json's chat_template); empty: the model's.
  std::string chat_template_path;
  // --generation-config (CONNEX_GENERATION_CONFIG): true ("auto", the default, as vLLM's): a
  // request that omits a sampling field gets the model's generation_config.json value
  // (temperature, top_p, top_k, min_p, repetition_penalty); false ("none"): the built-in
  // SamplingDefaults (greedy).
  bool generation_config = true;
};

// The sampling defaults a server applies: the built-in ones, overridden by the fields that the
// model's generation_config.json sets.
SamplingDefaults SamplingDefaultsOf(const engine::GenerationDefaults& generation);

// The KV bytes one token costs on the pipeline's largest stage (its share of the layers, K and V
// in f32): what admission charges each position of a request.
int64_t KvBytesPerToken(const engine::ModelConfig& config, uint32_t stages);

class OpenAiServer {
 public:
  // Binds options.http's address and answers at once; completions are 503 and /health says
  // "starting" until Attach. (The address goes into stage 0's record, so it must be known
  // before the stage joins.)
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Listen(OpenAiServerOptions options);
  // Serves `stage` (stage 0) from now on, with the tokenizer and chat template of its model
  // directory (an error naming the file when they do not load). Stop the server, then the
  // stage, then destroy the server: the node's last callbacks (requests ended by its Stop) come
  // to it.
  absl::Status Attach(StageProcess& stage);
  // Listen, then Attach.
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(StageProcess& stage,
                                                             OpenAiServerOptions options);
  ~OpenAiServer();  // Stop()

  // "HOST:PORT" actually bound.
  std::string address() const { return http_->address(); }
  // Stops accepting, lets responses in flight finish (the HTTP drain timeout), cancels the rest.
  void Stop();

 private:
  struct Generation;
  explicit OpenAiServer(OpenAiServerOptions options);
  // Submits an admitted generation to the node (any thread but the node's).
  void StartGeneration(StageProcess& stage, const std::shared_ptr<Generation>& g);
  // Returns a finished generation's KV charge; queued ones may start now.
  void ReleaseBudget(int64_t bytes);
  // The admission thread: starts queued generations as the budget frees.
  void AdmitQueued();
  StageProcess* stage() const { return stage_.load(); }
  // What a request to `stage`'s model may ask for.
  RequestLimits Limits(StageProcess& stage) const;
  void Complete(StageProcess& stage, Endpoint endpoint, std::shared_ptr<HttpExchange> exchange);
  void OnToken(const std::shared_ptr<Generation>& g, int32_t token);
  void OnDone(const std::shared_ptr<Generation>& g, absl::StatusOr<std::vector<int32_t>> result);
  std::string RenderMetrics();

  std::unique_ptr<const ModelText> text_;  // set by Attach, before stage_
  SamplingDefaults sampling_defaults_;     // set by Attach, before stage_
  std::atomic<StageProcess*> stage_{nullptr};
  const OpenAiServerOptions options_;
  Router router_;
  std::unique_ptr<HttpServer> http_;
  std::atomic<uint64_t> next_id_;
  const int64_t created_;  // Unix seconds, for /v1/models

  MetricsRegistry metrics_;
  RequestMetrics requests_;
  Gauge* kv_used_ = nullptr;
  Gauge* queued_gauge_ = nullptr;
  Counter* refused_ = nullptr;

  // Admission (KV budget and queue).
  Mutex admission_mu_;
  int64_t kv_in_use_ ABSL_GUARDED_BY(admission_mu_) = 0;
  int64_t queue_reserved_ ABSL_GUARDED_BY(admission_mu_) = 0;  // admitted to the queue, not in yet
  std::deque<std::shared_ptr<Generation>> queue_ ABSL_GUARDED_BY(admission_mu_);
  bool stopping_ ABSL_GUARDED_BY(admission_mu_) = false;
  std::thread admitter_;
  Counter* failovers_ = nullptr;  // the node's counters, brought up to date at each scrape
  Counter* reprefills_ = nullptr;
  Mutex scrape_mu_;
  uint64_t failovers_seen_ ABSL_GUARDED_BY(scrape_mu_) = 0;
  uint64_t reprefills_seen_ ABSL_GUARDED_BY(scrape_mu_) = 0;
};

}  // namespace connex::serving

#endif  // CONNEX_SERVING_OPENAI_SERVER_H_
