#include "connex/serving/openai_server.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <random>

#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/serving/api_error.h"
#include "connex/serving/node_metrics.h"
#include "connex/serving/openai_response.h"
#include "connex/serving/openai_stream.h"
#include "connex/serving/stop_strings.h"
#include "connex/serving/tokenize_endpoints.h"

namespace connex::serving {
namespace {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// One completion in flight. Its callbacks come from the node's loop thread (one at a time);
// the HTTP side only reads `exchange` and asks the node to cancel.
struct OpenAiServer::Generation {
  uint64_t id = 0;
  CompletionRequest request;
  std::vector<int32_t> prompt;
  std::shared_ptr<HttpExchange> exchange;
  ResponseHeader header;
  std::optional<ChunkBuilder> chunks;  // streaming
  std::optional<StopStringFilter> stop;
  std::unique_ptr<engine::StreamDecoder> decoder;  // the generated text, after the prompt's
  std::vector<int32_t> tokens;                     // generated so far
  std::deque<std::pair<int32_t, size_t>> unsent;   // tokens not in a chunk yet, with their bytes
  bool stopped_by_string = false;
  std::vector<int32_t> stop_tokens;  // the model's (ModelText::stop_tokens) unless ignore_eos
  pp::SubmitOptions submit;          // sampling; on_token is set when it starts
  int64_t kv_cost = 0;               // its charge against the KV budget while admitted
  int64_t start_us = 0;
  int64_t last_token_us = 0;

  // The tokens whose text makes up the first `bytes` bytes of what is still unsent. A token
  // without text of its own goes with the text after it: its text may be held back (the start
  // of a character that the next token completes), and a token id is never sent before its text
  // (a resume continues from the ids sent).
  std::vector<int32_t> TakeTokens(size_t bytes) {
    std::vector<int32_t> out;
    while (!unsent.empty() && bytes > 0 && unsent.front().second <= bytes) {
      bytes -= unsent.front().second;
      out.push_back(unsent.front().first);
      unsent.pop_front();
    }
    return out;
  }
  std::vector<int32_t> TakeAllTokens() { return TakeTokens(SIZE_MAX); }
  // Whether `token` ends the completion (the owner decides the same: pp::StopTokens).
  bool Stops(int32_t token) const {
    const std::vector<int32_t>& ids = request.stop_token_ids;
    return std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end() ||
           std::find(ids.begin(), ids.end(), token) != ids.end();
  }
};

int64_t KvBytesPerToken(const engine::ModelConfig& config, uint32_t stages) {
  const int64_t layers = (config.num_hidden_layers + stages - 1) / std::max<uint32_t>(stages, 1);
  return 2 * config.kv_dim() * layers * static_cast<int64_t>(sizeof(float));
}

OpenAiServer::OpenAiServer(OpenAiServerOptions options)
    : options_(std::move(options)), created_(UnixSeconds()), requests_(metrics_) {
  std::random_device rd;
  next_id_.store((static_cast<uint64_t>(rd()) << 24) | 1);
  kv_used_ = &metrics_
                  .AddGauge("connex_stage_kv_budget_used_bytes",
                            "KV cache of the requests admitted here, on the largest stage "
                            "(CONNEX_STAGE_KV_BUDGET_BYTES bounds it)")
                  .Get();
  metrics_.AddGauge("connex_stage_kv_budget_bytes", "The KV budget of a stage (bytes)")
      .Get()
      .Set(static_cast<double>(options_.kv_budget_bytes));
  queued_gauge_ =
      &metrics_
           .AddGauge("connex_requests_queued",
                     "Requests waiting for KV budget (CONNEX_STAGE_QUEUE_MAX bounds it)")
           .Get();
  refused_ = &metrics_
                  .AddCounter("connex_requests_refused_total",
                              "Requests answered 429: no KV budget and the queue full")
                  .Get();
  admitter_ = std::thread([this] { AdmitQueued(); });
  failovers_ = &metrics_
                    .AddCounter("connex_failovers_total",
                                "Steps of this owner's requests that moved to another replica")
                    .Get();
  reprefills_ = &metrics_
                     .AddCounter("connex_reprefills_total",
                                 "Requests recomputed because a stage did not hold their state")
                     .Get();
}

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Listen(OpenAiServerOptions options) {
  if (options.default_max_tokens < 1) {
    return absl::InvalidArgumentError(
        StrCat("default max_tokens ", options.default_max_tokens, " must be at least 1"));
  }
  std::unique_ptr<OpenAiServer> s(new OpenAiServer(options));
  OpenAiServer* self = s.get();
  auto starting = [](HttpExchange& x) {
    x.Respond(ErrorResponse(absl::UnavailableError("the stage is starting")));
  };
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    s->router_.Add("POST", std::string(EndpointPath(endpoint)),
                   [self, endpoint, starting](std::shared_ptr<HttpExchange> x) {
                     StageProcess* stage = self->stage();
                     if (stage == nullptr) return starting(*x);
                     self->Complete(*stage, endpoint, std::move(x));
                   });
  }
  s->router_.Add("POST", kTokenizePath, [self, starting](std::shared_ptr<HttpExchange> x) {
    StageProcess* stage = self->stage();
    if (stage == nullptr) return starting(*x);
    x->Respond(TokenizeResponse(*self->text_, self->Limits(*stage), stage->config().max_positions(),
                                x->request().body));
  });
  s->router_.Add("POST", kDetokenizePath, [self, starting](std::shared_ptr<HttpExchange> x) {
    StageProcess* stage = self->stage();
    if (stage == nullptr) return starting(*x);
    x->Respond(DetokenizeResponse(*self->text_, self->Limits(*stage), x->request().body));
  });
  s->router_.Add("GET", "/v1/models", [self, starting](std::shared_ptr<HttpExchange> x) {
    StageProcess* stage = self->stage();
    if (stage == nullptr) return starting(*x);
    std::vector<std::string> models = {stage->model_name()};
    x->Respond(JsonResponse(200, ModelsResponse(models, self->created_)));
  });
  s->router_.AddPrefix("GET", "/v1/models/", [self, starting](std::shared_ptr<HttpExchange> x) {
    StageProcess* stage = self->stage();
    if (stage == nullptr) return starting(*x);
    const std::string id = ModelIdOfPath(x->request().path);
    if (id != stage->model_name()) {
      x->Respond(ErrorResponse(ModelNotFound(id)));
      return;
    }
    x->Respond(JsonResponse(200, ModelResponse(id, self->created_)));
  });
  s->router_.AddInline("GET", "/health", [self](std::shared_ptr<HttpExchange> x) {
    StageProcess* stage = self->stage();
    absl::Status ready =
        stage == nullptr ? absl::UnavailableError("the stage is starting") : stage->ChainReady();
    x->Respond(
        JsonResponse(ready.ok() ? 200 : 503, HealthResponse(ready.ok(), AsStd(ready.message()))));
  });
  s->router_.AddInline("GET", "/metrics", [self](std::shared_ptr<HttpExchange> x) {
    HttpResponse r;
    r.content_type = std::string(kPrometheusContentType);
    r.body = self->RenderMetrics();
    x->Respond(std::move(r));
  });
  CONNEX_ASSIGN_OR_RETURN(s->http_, StartHttpServer(options.http, s->router_.AsHandler(),
                                                    s->router_.AsInlinePredicate()));
  return s;
}

absl::Status OpenAiServer::Attach(StageProcess& stage) {
  if (stage.lid().group != 0) {
    return absl::InvalidArgumentError(
        StrCat("--http: only stage 0 serves the API (this is stage ", stage.lid().group, ")"));
  }
  if (text_ != nullptr) return absl::FailedPreconditionError("the API already serves a stage");
  absl::StatusOr<std::unique_ptr<const ModelText>> text = ModelText::Load(
      stage.model_path(), stage.config().eos_token_ids, options_.chat_template_path);
  if (!text.ok()) return Annotate(text.status(), StrCat("--model ", stage.model_path()));
  text_ = *std::move(text);
  if (options_.generation_config) {
    sampling_defaults_ = SamplingDefaultsOf(stage.config().generation);
    if (sampling_defaults_ != SamplingDefaults{}) {
      const SamplingDefaults& d = sampling_defaults_;
      CONNEX_LOG_INFO(
          "serving {}: generation_config.json's defaults for requests that omit them "
          "(--generation-config auto): temperature {}, top_p {}, top_k {}, min_p {}, "
          "repetition_penalty {}",
          stage.model_name(), d.temperature, d.top_p, d.top_k, d.min_p, d.repetition_penalty);
    }
  }
  CONNEX_LOG_INFO("serving {}: {} tokenizer, chat template {}", stage.model_name(),
                  text_->byte_level() ? "byte" : "tokenizer.json",
                  text_->chat_template_source().empty() ? "none (completions only)"
                                                        : text_->chat_template_source());
  stage_.store(&stage);
  requests_.AddVllmAliases(stage.model_name());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(StageProcess& stage,
                                                                  OpenAiServerOptions options) {
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<OpenAiServer> s, Listen(std::move(options)));
  CONNEX_RETURN_IF_ERROR(s->Attach(stage));
  return s;
}

OpenAiServer::~OpenAiServer() { Stop(); }

void OpenAiServer::Stop() {
  if (http_) http_->Stop();  // cancels what is still queued: those exchanges are gone
  {
    MutexLock lock(&admission_mu_);
    stopping_ = true;
  }
  if (admitter_.joinable()) admitter_.join();
}

void OpenAiServer::ReleaseBudget(int64_t bytes) {
  MutexLock lock(&admission_mu_);
  kv_in_use_ -= bytes;
  kv_used_->Set(static_cast<double>(kv_in_use_));
}

void OpenAiServer::AdmitQueued() {
  while (true) {
    std::shared_ptr<Generation> g;
    {
      MutexLock lock(&admission_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(admission_mu_) {
        return stopping_ || (!queue_.empty() &&
                             kv_in_use_ + queue_.front()->kv_cost <= options_.kv_budget_bytes);
      };
      admission_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      if (stopping_) return;
      if (!ready()) continue;
      g = std::move(queue_.front());
      queue_.pop_front();
      queued_gauge_->Set(static_cast<double>(queue_.size()));
      kv_in_use_ += g->kv_cost;
      kv_used_->Set(static_cast<double>(kv_in_use_));
    }
    StageProcess* stage = this->stage();
    if (g->exchange->cancelled() || stage == nullptr) {  // its client left while it waited
      ReleaseBudget(g->kv_cost);
      requests_.Ended(/*got_token=*/false);
      continue;
    }
    StartGeneration(*stage, g);
  }
}

std::string OpenAiServer::RenderMetrics() {
  StageProcess* stage = this->stage();
  std::string node;
  if (stage != nullptr) {
    pp::StageNodeStats stats = stage->node().stats();
    node = RenderNodeStats(stats);  // the step protocol's state, as on every stage
    MutexLock lock(&scrape_mu_);
    if (stats.failovers > failovers_seen_) {
      failovers_->Increment(static_cast<double>(stats.failovers - failovers_seen_));
      failovers_seen_ = stats.failovers;
    }
    if (stats.reprefills > reprefills_seen_) {
      reprefills_->Increment(static_cast<double>(stats.reprefills - reprefills_seen_));
      reprefills_seen_ = stats.reprefills;
    }
  }
  return metrics_.Render() + node;
}

namespace {

// A request the pipeline could not run ended for a reason of the server's (this stage lost its
// LID or was drained, the stage stopped): never the client's fault. FailedPrecondition and
// Cancelled there name this stage's state, so they are answered as Unavailable (503,
// server_error), which connex-proxy retries on another replica; the request's own faults
// (InvalidArgument, ...) stay what they are.
absl::Status ServerSide(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kFailedPrecondition ||
      status.code() == absl::StatusCode::kCancelled) {
    return absl::UnavailableError(status.message());
  }
  return status;
}

}  // namespace

SamplingDefaults SamplingDefaultsOf(const engine::GenerationDefaults& generation) {
  SamplingDefaults d;
  d.temperature = generation.temperature.value_or(d.temperature);
  d.top_p = generation.top_p.value_or(d.top_p);
  d.top_k = generation.top_k.value_or(d.top_k);
  d.min_p = generation.min_p.value_or(d.min_p);
  d.repetition_penalty = generation.repetition_penalty.value_or(d.repetition_penalty);
  return d;
}

RequestLimits OpenAiServer::Limits(StageProcess& stage) const {
  RequestLimits limits;
  limits.models = {stage.model_name()};
  limits.vocab_size = stage.config().vocab_size;
  limits.default_max_tokens = options_.default_max_tokens;
  limits.max_tokens_limit = stage.config().max_positions();
  return limits;
}

void OpenAiServer::Complete(StageProcess& stage, Endpoint endpoint,
                            std::shared_ptr<HttpExchange> exchange) {
  const int64_t arrived_us = NowUs();
  const engine::ModelConfig& config = stage.config();
  absl::StatusOr<CompletionRequest> parsed =
      ParseCompletionRequest(endpoint, exchange->request().body, Limits(stage));
  if (!parsed.ok()) {
    exchange->Respond(ErrorResponse(parsed.status()));
    return;
  }
  auto g = std::make_shared<Generation>();
  g->request = *std::move(parsed);
  const CompletionRequest& req = g->request;
  // Chat: the model's template, its text tokenized as it is (the template writes BOS); a text
  // prompt with the tokenizer's special tokens; token ids exactly as given.
  const std::string input_field = endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  absl::StatusOr<std::vector<int32_t>> prompt = req.prompt_token_ids;
  if (endpoint == Endpoint::kChatCompletions) {
    prompt = text_->ChatPrompt(req.messages);
  } else if (req.prompt_text) {
    prompt = text_->CompletionPrompt(*req.prompt_text);
  }
  if (!prompt.ok()) {
    exchange->Respond(ErrorResponse(
        InvalidRequest(input_field, "invalid_value", AsStd(prompt.status().message()))));
    return;
  }
  g->prompt = *std::move(prompt);
  if (g->prompt.empty()) {
    exchange->Respond(
        ErrorResponse(InvalidRequest(input_field, "invalid_value", "the prompt is empty")));
    return;
  }
  const int64_t context = config.max_positions();
  if (static_cast<int64_t>(g->prompt.size()) + req.max_tokens > context) {
    exchange->Respond(ErrorResponse(InvalidRequest(
        static_cast<int64_t>(g->prompt.size()) >= context ? input_field : "max_tokens",
        "context_length_exceeded",
        StrCat("this model's context is ", context, " tokens; the prompt has ", g->prompt.size(),
               " and max_tokens asks for ", req.max_tokens))));
    return;
  }
  pp::SubmitOptions submit;
  const SamplingDefaults& d = sampling_defaults_;
  submit.sampling.temperature = static_cast<float>(req.temperature.value_or(d.temperature));
  submit.sampling.top_p = static_cast<float>(req.top_p.value_or(d.top_p));
  const int64_t top_k = req.top_k.value_or(d.top_k);
  submit.sampling.top_k = top_k > 0 ? static_cast<int32_t>(top_k) : 0;
  submit.sampling.min_p = static_cast<float>(req.min_p.value_or(d.min_p));
  submit.sampling.repetition_penalty =
      static_cast<float>(req.repetition_penalty.value_or(d.repetition_penalty));
  submit.ignore_eos = req.ignore_eos;
  submit.stop_token_ids = req.stop_token_ids;
  // The node stops on the model's first end token; the model's other stop tokens (its other
  // EOS ids, the tokenizer's EOS, the chat template's end of turn: ModelText) end the request
  // the same way, in the owner, unless ignore_eos — exact across failover and resume.
  if (!req.ignore_eos) {
    g->stop_tokens = text_->stop_tokens();
    submit.stop_token_ids.insert(submit.stop_token_ids.end(), g->stop_tokens.begin(),
                                 g->stop_tokens.end());
  }
  if (req.seed) {
    submit.sampling.seed = *req.seed;
  } else {
    std::random_device rd;
    submit.sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  g->id = next_id_.fetch_add(1);
  g->exchange = exchange;
  g->header =
      ResponseHeader{endpoint, MakeResponseId(endpoint, g->id), UnixSeconds(), stage.model_name()};
  g->stop.emplace(req.stop);
  g->decoder = text_->NewDecoder(g->prompt);
  g->start_us = arrived_us;
  g->submit = std::move(submit);
  // Admission: the request's whole context of KV on the largest stage, now or after a wait in a
  // bounded queue; past both, a 429 the client (or connex-proxy, on another replica) retries.
  g->kv_cost = (static_cast<int64_t>(g->prompt.size()) + req.max_tokens) *
               KvBytesPerToken(config, stage.layer_stages());
  if (g->kv_cost > options_.kv_budget_bytes) {
    exchange->Respond(ErrorResponse(
        InvalidRequest("max_tokens", "context_length_exceeded",
                       StrCat("the prompt and max_tokens need ", g->kv_cost,
                              " bytes of KV cache per stage, more than a stage's budget of ",
                              options_.kv_budget_bytes, " (CONNEX_STAGE_KV_BUDGET_BYTES)"))));
    return;
  }
  bool admitted = false;
  {
    MutexLock lock(&admission_mu_);
    if (queue_.empty() && queue_reserved_ == 0 &&
        kv_in_use_ + g->kv_cost <= options_.kv_budget_bytes) {
      admitted = true;
      kv_in_use_ += g->kv_cost;
      kv_used_->Set(static_cast<double>(kv_in_use_));
    } else if (static_cast<int64_t>(queue_.size()) + queue_reserved_ < options_.queue_max) {
      ++queue_reserved_;
    } else {
      refused_->Increment();
      HttpResponse busy = ErrorResponse(
          WithApiDetails(absl::ResourceExhaustedError(
                             StrCat("stage 0 of ", stage.model_name(), " is at its KV budget (",
                                    options_.kv_budget_bytes, " bytes) with ", queue_.size(),
                                    " requests waiting; retry later or on another replica")),
                         "", "rate_limit_exceeded"));
      busy.headers.emplace_back("Retry-After", "1");
      exchange->Respond(std::move(busy));
      return;
    }
  }
  requests_.Accepted();
  if (req.stream) {
    g->chunks.emplace(g->header, req.include_usage);
    if (!exchange->StartStream()) {  // the client is gone already
      requests_.Ended(/*got_token=*/false);
      MutexLock lock(&admission_mu_);
      if (admitted) {
        kv_in_use_ -= g->kv_cost;
        kv_used_->Set(static_cast<double>(kv_in_use_));
      } else {
        --queue_reserved_;
      }
      return;
    }
    if (const int64_t every = options_.stream_keepalive_ms; every > 0) {
      exchange->KeepStreamAlive(every, std::string(kSseKeepAlive),
                                [&stage, every] { return stage.node().Turning(every); });
    }
  }
  if (admitted) return StartGeneration(stage, g);
  std::weak_ptr<Generation> weak = g;
  {
    MutexLock lock(&admission_mu_);
    --queue_reserved_;
    queue_.push_back(g);
    queued_gauge_->Set(static_cast<double>(queue_.size()));
  }
  // A client that leaves while its request waits takes it out of the queue.
  exchange->OnCancel([this, weak] {
    std::shared_ptr<Generation> gone = weak.lock();
    if (gone == nullptr) return;
    MutexLock lock(&admission_mu_);
    auto it = std::find(queue_.begin(), queue_.end(), gone);
    if (it == queue_.end()) return;  // started meanwhile: its own OnCancel cancels it
    queue_.erase(it);
    queued_gauge_->Set(static_cast<double>(queue_.size()));
    requests_.Ended(/*got_token=*/false);
  });
}

void OpenAiServer::StartGeneration(StageProcess& stage, const std::shared_ptr<Generation>& g) {
  const CompletionRequest& req = g->request;
  const Endpoint endpoint = req.endpoint;
  HttpExchange* exchange = g->exchange.get();
  pp::SubmitOptions submit = g->submit;
  submit.on_token = [this, g](uint64_t, int32_t token) { OnToken(g, token); };
  requests_.prompt_tokens.Increment(static_cast<double>(g->prompt.size()));
  const uint64_t id = g->id;
  absl::Status submitted = stage.node().Submit(
      id, g->prompt, static_cast<int>(req.max_tokens),
      [this, g](uint64_t, absl::StatusOr<std::vector<int32_t>> result) {
        OnDone(g, std::move(result));
      },
      std::move(submit));
  submitted = ServerSide(submitted);
  if (!submitted.ok()) {
    ReleaseBudget(g->kv_cost);
    requests_.Ended(/*got_token=*/false);
    LogRequestAccess({g->header.id, EndpointPath(endpoint), HttpStatusOf(submitted),
                      static_cast<int64_t>(g->prompt.size()), 0, NowUs() - g->start_us,
                      AsStd(submitted.message())});
    if (req.stream) {
      exchange->Send(ChunkBuilder::ErrorEnd(submitted));
      exchange->EndStream();
    } else {
      exchange->Respond(ErrorResponse(submitted));
    }
    return;
  }
  // A client that goes away cancels its request (and frees its state on every stage).
  exchange->OnCancel(
      [&stage, id] { stage.node().CancelLater(id, absl::CancelledError("the client went away")); });
}

void OpenAiServer::OnToken(const std::shared_ptr<Generation>& g, int32_t token) {
  const int64_t now = NowUs();
  if (g->tokens.empty()) {
    requests_.FirstToken();
    requests_.ttft.Observe(static_cast<double>(now - g->start_us) / 1e6);
  } else {
    requests_.itl.Observe(static_cast<double>(now - g->last_token_us) / 1e6);
  }
  g->last_token_us = now;
  requests_.generation_tokens.Increment();
  g->tokens.push_back(token);
  // A stop token (the model's, unless ignore_eos; a stop_token_ids one) ends the request — the
  // owner decides the same (pp::StopTokens) — and has no text (vLLM's rule); other text comes
  // out of the decoder whole characters at a time.
  std::string text;
  if (!g->Stops(token)) {
    absl::StatusOr<std::string> decoded = g->decoder->Push(token);
    if (decoded.ok()) text = *std::move(decoded);
  }
  g->unsent.emplace_back(token, text.size());
  const std::string safe = g->stop->Append(text);  // before a stop string, if one completed
  if (g->chunks && !safe.empty()) {
    std::vector<int32_t> ids = g->TakeTokens(safe.size());
    g->exchange->Send(g->chunks->Delta(safe, ids, g->prompt));
  }
  if (g->stop->stopped() && !g->stopped_by_string) {
    g->stopped_by_string = true;
    // On the node's loop: ends the request now; OnDone follows with Cancelled.
    (void)stage()->node().Cancel(g->id, absl::CancelledError("a stop string matched"));
  }
}

void OpenAiServer::OnDone(const std::shared_ptr<Generation>& g,
                          absl::StatusOr<std::vector<int32_t>> result) {
  ReleaseBudget(g->kv_cost);
  requests_.Ended(/*got_token=*/!g->tokens.empty());
  const int64_t latency_us = NowUs() - g->start_us;
  requests_.e2e.Observe(static_cast<double>(latency_us) / 1e6);
  HttpExchange& x = *g->exchange;
  auto access = [&](int status, std::string_view outcome) {
    LogRequestAccess({g->header.id, EndpointPath(g->request.endpoint), status,
                      static_cast<int64_t>(g->prompt.size()),
                      static_cast<int64_t>(g->tokens.size()), latency_us, outcome});
  };
  const bool stopped = g->stopped_by_string;
  if (!result.ok() && !stopped) result = ServerSide(result.status());
  if (!result.ok() && !stopped) {
    // A client that went away is logged with nginx's 499 ("client closed request").
    access(x.cancelled() ? 499 : HttpStatusOf(result.status()), AsStd(result.status().message()));
    if (x.cancelled()) return;  // the client is gone: nobody to tell
    CONNEX_LOG_WARN("serving: request {} failed: {}", g->id, result.status().ToString());
    if (g->chunks) {
      x.Send(ChunkBuilder::ErrorEnd(result.status()));
      x.EndStream();
    } else {
      x.Respond(ErrorResponse(result.status()));
    }
    return;
  }
  FinishReason finish = FinishReason::kLength;
  if (g->stopped_by_string || (!g->tokens.empty() && g->Stops(g->tokens.back()))) {
    finish = FinishReason::kStop;
  }
  requests_.success.WithLabels({std::string(FinishReasonName(finish))}).Increment();
  access(200, FinishReasonName(finish));
  // What was held back (a possible stop string's start, a partial character) goes now.
  std::string rest;
  if (!g->stop->stopped()) {
    absl::StatusOr<std::string> held = g->decoder->Flush();
    if (held.ok()) rest = g->stop->Append(*held);
    if (!g->stop->stopped()) rest += g->stop->Finish();
  }
  if (g->chunks) {
    std::vector<int32_t> ids = g->TakeAllTokens();
    x.Send(g->chunks->Delta(rest, ids, g->prompt, finish));
    x.Send(g->chunks->End(
        Usage{static_cast<int64_t>(g->prompt.size()), static_cast<int64_t>(g->tokens.size())}));
    x.EndStream();
    return;
  }
  Completion c;
  c.text = std::string(g->stop->output());  // everything handed out, Finish's rest included
  c.token_ids = g->tokens;
  c.prompt_token_ids = g->prompt;
  c.finish_reason = finish;
  x.Respond(JsonResponse(200, CompletionResponse(g->header, c)));
}

}  // namespace connex::serving
