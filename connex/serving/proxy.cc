#include "connex/serving/proxy.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <thread>
#include <unordered_set>

#include "boost/asio.hpp"
#include "connex/base/logging.h"
#include "connex/base/mutex.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/serving/api_error.h"
#include "connex/serving/internal/forward.h"
#include "connex/serving/internal/replica_balancer.h"
#include "connex/serving/internal/retry_policy.h"
#include "connex/serving/internal/upstream.h"
#include "connex/serving/metrics.h"
#include "connex/serving/openai_api.h"
#include "connex/serving/openai_response.h"
#include "connex/serving/openai_stream.h"
#include "connex/serving/router.h"

namespace connex::serving {
namespace {

namespace asio = boost::asio;
using SteadyClock = std::chrono::steady_clock;
using internal::ErrorMessageOf;
using internal::MakeUpstreamRequest;
using internal::ReplicaBalancer;
using internal::RetryPolicy;
using internal::UpstreamCall;
using AttemptPtr = internal::UpstreamCall::Ptr;

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status ProxyOptions::Validate() const {
  if (model.empty()) return absl::InvalidArgumentError("--model: the served model's name is empty");
  if (retry_budget_ms < 0) {
    return absl::InvalidArgumentError(
        StrCat("retry budget ", retry_budget_ms, " ms must not be negative"));
  }
  if (max_attempts < 1) {
    return absl::InvalidArgumentError(StrCat("max attempts ", max_attempts, " must be at least 1"));
  }
  if (default_max_tokens < 1) {
    return absl::InvalidArgumentError(
        StrCat("default max_tokens ", default_max_tokens, " must be at least 1"));
  }
  if (connect_timeout_ms < 1 || idle_timeout_ms < 1 || stream_keepalive_ms < 0) {
    return absl::InvalidArgumentError(
        "the connect and idle timeouts must be at least 1 ms, the stream keep-alive at least 0");
  }
  return absl::OkStatus();
}

class ResumeProxy::Impl {
 public:
  explicit Impl(ProxyOptions options)
      : options_(std::move(options)), work_(asio::make_work_guard(io_)), created_(UnixSeconds()) {
    std::random_device rd;
    next_id_ = (static_cast<uint64_t>(rd()) << 24) | 1;
    replicas_gauge_ =
        &metrics_.AddGauge("connex_proxy_replicas", "Stage-0 replicas known from the directory")
             .Get();
    failures_ = &metrics_
                     .AddCounter("connex_request_failure_total",
                                 "Requests that ended with an error after their retries")
                     .Get();
    retries_ = &metrics_
                    .AddCounter("connex_proxy_retries_total",
                                "Upstream attempts made after a replica failed a request")
                    .Get();
    resumes_ = &metrics_
                    .AddCounter("connex_proxy_resumes_total",
                                "Retries that continued a response already under way")
                    .Get();
    cancelled_ = &metrics_
                      .AddCounter("connex_proxy_cancelled_total",
                                  "Requests whose client went away before the answer was whole "
                                  "(their upstream attempt is closed, which cancels them there)")
                      .Get();
  }

  absl::Status Start() {
    requests_.AddVllmAliases(options_.model);
    for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
      router_.Add("POST", std::string(EndpointPath(endpoint)),
                  [this, endpoint](std::shared_ptr<HttpExchange> x) { Accept(endpoint, x); });
    }
    for (const char* path : {"/tokenize", "/detokenize"}) {  // answered by a stage 0 as is
      router_.Add("POST", path, [this, path](std::shared_ptr<HttpExchange> x) {
        auto answer = internal::ForwardToReplicas(replicas(), path, x->request().body,
                                                  options_.idle_timeout_ms);
        x->Respond(answer.ok() ? JsonResponse(answer->status, std::move(answer->body))
                               : ErrorResponse(answer.status()));
      });
    }
    router_.Add("GET", "/v1/models", [this](std::shared_ptr<HttpExchange> x) {
      std::vector<std::string> models = {options_.model};
      x->Respond(JsonResponse(200, ModelsResponse(models, created_)));
    });
    router_.AddPrefix("GET", "/v1/models/", [this](std::shared_ptr<HttpExchange> x) {
      const std::string id = ModelIdOfPath(x->request().path);
      if (id != options_.model) {
        x->Respond(ErrorResponse(ModelNotFound(id)));
        return;
      }
      x->Respond(JsonResponse(200, ModelResponse(id, created_)));
    });
    router_.AddInline("GET", "/health", [this](std::shared_ptr<HttpExchange> x) {
      std::string problem;
      {
        MutexLock lock(&mu_);
        if (replicas_.empty()) {
          problem =
              StrCat("no stage-0 replica of ", options_.model, " is registered in the directory");
        } else if (!chain_problem_.empty()) {
          problem = StrCat("model ", options_.model, " cannot serve: ", chain_problem_);
        }
      }
      const bool ok = problem.empty();
      x->Respond(JsonResponse(ok ? 200 : 503, HealthResponse(ok, problem)));
    });
    router_.AddInline("GET", "/metrics", [this](std::shared_ptr<HttpExchange> x) {
      HttpResponse r;
      r.content_type = std::string(kPrometheusContentType);
      r.body = metrics_.Render();
      x->Respond(std::move(r));
    });
    io_thread_ = std::thread([this] { io_.run(); });
    absl::StatusOr<std::unique_ptr<HttpServer>> http =
        StartHttpServer(options_.http, router_.AsHandler(), router_.AsInlinePredicate());
    if (!http.ok()) {
      StopIo();
      return http.status();
    }
    http_ = *std::move(http);
    return absl::OkStatus();
  }

  ~Impl() { Stop(); }

  void Stop() {
    if (http_) http_->Stop();  // cancels the exchanges left after the drain
    StopIo();
  }

  std::string address() const { return http_->address(); }

  void SetReplicas(std::vector<Replica> replicas) {
    {
      MutexLock lock(&mu_);
      if (replicas == replicas_) return;
      for (const Replica& r : replicas) {
        if (std::find(replicas_.begin(), replicas_.end(), r) == replicas_.end()) {
          CONNEX_LOG_INFO("proxy: replica {} at {}", r.name, r.http_address);
        }
      }
      replicas_ = std::move(replicas);
      replicas_gauge_->Set(static_cast<double>(replicas_.size()));
    }
    asio::post(io_, [this] { WakeWaiting(); });
  }

  std::vector<Replica> replicas() const {
    MutexLock lock(&mu_);
    return replicas_;
  }

  void SetChainProblem(std::string problem) {
    MutexLock lock(&mu_);
    if (problem != chain_problem_ && !problem.empty()) {
      CONNEX_LOG_WARN("proxy: model {} cannot serve: {}", options_.model, problem);
    }
    chain_problem_ = std::move(problem);
  }

  Stats stats() const {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // One client request. Touched on the I/O thread only (after Accept posts it there).
  struct Proxied {
    Proxied(asio::io_context& io, const ProxyOptions& o)
        : retry(o.max_attempts, o.retry_budget_ms), wait(io) {}
    uint64_t id = 0;
    std::shared_ptr<HttpExchange> exchange;
    CompletionRequest request;
    ResponseHeader header;
    std::optional<ChunkBuilder> chunks;  // the client streams
    std::vector<int32_t> prompt;         // from the first chunk of the first attempt that sent one
    std::vector<int32_t> tokens;         // delivered to the client
    std::string text;                    // delivered (non-streaming: the response's text)
    std::optional<FinishReason> finish;
    bool stream_started = false;
    bool ended = false;
    RetryPolicy retry;  // attempts, the outage's budget, the backoff, the replica to avoid
    AttemptPtr attempt;
    asio::steady_timer wait;  // backing off / waiting for a replica
    bool waiting = false;
    int64_t start_us = 0;
    int64_t last_token_us = 0;
  };
  using ProxiedPtr = std::shared_ptr<Proxied>;

  void StopIo() {
    if (!io_thread_.joinable()) return;
    asio::post(io_, [this] {
      // Whatever the HTTP server's stop left (it cancelled every open exchange) ends now.
      std::vector<ProxiedPtr> live(live_.begin(), live_.end());
      for (const ProxiedPtr& p : live) Cancel(p);
    });
    work_.reset();
    io_thread_.join();
  }

  // ---- handler threads ----

  void Accept(Endpoint endpoint, const std::shared_ptr<HttpExchange>& exchange) {
    RequestLimits limits;
    limits.models = {options_.model};
    limits.vocab_size = int64_t{1} << 31;  // the replicas check ids against their vocabulary
    limits.default_max_tokens = options_.default_max_tokens;
    absl::StatusOr<CompletionRequest> parsed =
        ParseCompletionRequest(endpoint, exchange->request().body, limits);
    if (!parsed.ok()) {
      exchange->Respond(ErrorResponse(parsed.status()));
      return;
    }
    auto p = std::make_shared<Proxied>(io_, options_);
    p->request = *std::move(parsed);
    if (!p->request.seed) {
      // Chosen here, once, so that every attempt samples the same tokens at the same positions.
      std::random_device rd;
      p->request.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    p->exchange = exchange;
    p->start_us = NowUs();
    {
      MutexLock lock(&mu_);
      p->id = next_id_++;
      ++stats_.requests;
    }
    p->header =
        ResponseHeader{endpoint, MakeResponseId(endpoint, p->id), UnixSeconds(), options_.model};
    if (p->request.stream) p->chunks.emplace(p->header, p->request.include_usage);
    requests_.Accepted();
    asio::post(io_, [this, p] {
      live_.insert(p);
      StartAttempt(p);
    });
    std::weak_ptr<Proxied> weak = p;
    exchange->OnCancel([this, weak] {
      asio::post(io_, [this, weak] {
        if (ProxiedPtr p = weak.lock()) Cancel(p);
      });
    });
  }

  // ---- I/O thread ----

  // The least busy live replica, preferring one other than the last to fail; nullopt when none
  // is up.
  std::optional<Replica> PickReplica(const Proxied& p) {
    return balancer_.Pick(replicas(), p.retry.avoid(), SteadyClock::now());
  }

  // When the earliest replica that is down comes back, if any does.
  std::optional<SteadyClock::time_point> NextReplicaUp() { return balancer_.NextUp(replicas()); }

  void StartAttempt(const ProxiedPtr& p) {
    if (p->ended) return;
    const int64_t left = p->request.max_tokens - static_cast<int64_t>(p->tokens.size());
    if (left <= 0) {
      // The replica died after the last token, before the chunk with finish_reason (with one,
      // AttemptFailed completes): p->finish stays unset, so Complete sends that chunk ("length").
      return Complete(p);
    }
    std::optional<Replica> replica = PickReplica(*p);
    if (!replica) {
      p->retry.NoReplica(SteadyClock::now(),
                         StrCat("no stage-0 replica of ", options_.model, " is registered"));
      return WaitAndRetry(p, /*alternative=*/false);
    }
    if (!p->retry.StartAttempt()) return GiveUp(p);
    {
      MutexLock lock(&mu_);
      ++stats_.attempts;
    }
    AttemptPtr a = UpstreamCall::Create(io_, *std::move(replica));
    balancer_.Started(a->replica().name);
    p->attempt = a;
    // Every callback runs on the I/O thread while `p` is live (an ended request closed it).
    std::weak_ptr<Proxied> weak = p;
    UpstreamCall::Callbacks callbacks;
    callbacks.on_connected = [this](const AttemptPtr& a) {
      balancer_.Connected(a->replica().name);
    };
    callbacks.on_event = [this, weak](const AttemptPtr& a, const StreamEvent& event) {
      if (ProxiedPtr p = weak.lock()) OnEvent(p, a, event);
    };
    callbacks.on_ended = [this, weak](const AttemptPtr& a, int status, std::string body) {
      if (ProxiedPtr p = weak.lock()) AttemptEnded(p, a, status, std::move(body));
    };
    callbacks.on_failed = [this, weak](const AttemptPtr& a, std::string why, bool connect) {
      if (ProxiedPtr p = weak.lock()) AttemptFailed(p, a, std::move(why), connect);
    };
    a->Start(MakeUpstreamRequest(p->request, p->prompt, p->tokens, left),
             {options_.connect_timeout_ms, options_.idle_timeout_ms}, std::move(callbacks));
  }

  // One event of the attempt's stream.
  void OnEvent(const ProxiedPtr& p, const AttemptPtr& a, const StreamEvent& event) {
    switch (event.kind) {
      case StreamEvent::Kind::kUsage:
        return;
      case StreamEvent::Kind::kDone:
        CloseAttempt(p, a);
        Complete(p);
        return;
      case StreamEvent::Kind::kError:
        if (event.server_error) {
          AttemptFailed(p, a, StrCat("it answered: ", event.error_message));
        } else {
          CloseAttempt(p, a);
          FailWith(p, 400, event.error_json);  // the request's fault (invalid_request_error)
        }
        return;
      case StreamEvent::Kind::kChunk:
        break;
    }
    if (p->prompt.empty()) p->prompt = event.prompt_token_ids;
    if (event.finish) p->finish = event.finish;
    if (event.text.empty() && event.token_ids.empty() && !event.finish) return;
    const int64_t now = NowUs();
    for (size_t i = 0; i < event.token_ids.size(); ++i) {
      if (p->tokens.empty() && i == 0) {
        requests_.FirstToken();
        requests_.ttft.Observe(static_cast<double>(now - p->start_us) / 1e6);
      } else {
        requests_.itl.Observe(static_cast<double>(now - p->last_token_us) / 1e6 /
                              static_cast<double>(event.token_ids.size()));
      }
    }
    if (!event.token_ids.empty()) {
      p->last_token_us = now;
      requests_.generation_tokens.Increment(static_cast<double>(event.token_ids.size()));
      p->retry.Progress();  // a later failure starts a new outage, with a new budget
    }
    p->tokens.insert(p->tokens.end(), event.token_ids.begin(), event.token_ids.end());
    p->text += event.text;
    if (p->chunks) {
      if (!p->stream_started) {
        p->stream_started = true;
        // Which replica began the answer (a resume may end it on another): for tools that
        // attribute a fault's cost to the requests of the faulted replica (connex-chaos).
        if (!p->exchange->StartStream(200, "text/event-stream",
                                      {{std::string(kReplicaHeader), a->replica().name}})) {
          return Cancel(p);
        }
        p->exchange->KeepStreamAlive(options_.stream_keepalive_ms, std::string(kSseKeepAlive),
                                     [] { return true; });  // the retry budget bounds its waits
      }
      if (!p->exchange->Send(
              p->chunks->Delta(event.text, event.token_ids, p->prompt, event.finish))) {
        Cancel(p);
      }
    }
  }

  // The upstream's HTTP message ended (streaming or not).
  void AttemptEnded(const ProxiedPtr& p, const AttemptPtr& a, int status, std::string body) {
    if (status == 200) {
      if (p->finish) {  // only [DONE] was missing
        CloseAttempt(p, a);
        return Complete(p);
      }
      return AttemptFailed(p, a, "the stream ended before its last chunk");
    }
    if (status >= 500 || status == 429) {
      std::string message = ErrorMessageOf(body);
      return AttemptFailed(p, a, StrCat("HTTP ", status, ": ", message));
    }
    // The replica refused the request itself: that is the client's answer.
    CloseAttempt(p, a);
    FailWith(p, status, std::move(body));
  }

  void CloseAttempt(const ProxiedPtr& p, const AttemptPtr& a) {
    if (a->closed()) return;
    a->Close();
    balancer_.Ended(a->replica().name);
    if (p->attempt == a) p->attempt.reset();
  }

  void AttemptFailed(const ProxiedPtr& p, const AttemptPtr& a, std::string why,
                     bool connect = false) {
    if (a->closed()) return;
    CloseAttempt(p, a);
    if (p->ended) return;
    if (p->finish) {
      // The chunk with finish_reason reached the client: the answer is whole, only the usage
      // chunk or [DONE] was lost. A resume would continue a finished response (past its EOS).
      CONNEX_LOG_INFO("proxy: request {}: replica {} broke after the last chunk ({}); completed",
                      p->header.id, a->replica().name, why);
      return Complete(p);
    }
    const Replica& r = a->replica();
    const SteadyClock::time_point now = SteadyClock::now();
    balancer_.Failed(r.name, connect, now);
    p->retry.Failed(now, r.name, StrCat("replica ", r.name, " at ", r.http_address, ": ", why));
    CONNEX_LOG_WARN("proxy: request {} ({} tokens delivered): {}", p->header.id, p->tokens.size(),
                    p->retry.last_error());
    {
      MutexLock lock(&mu_);
      ++stats_.retries;
      if (!p->tokens.empty()) ++stats_.resumes;
    }
    retries_->Increment();
    if (!p->tokens.empty()) resumes_->Increment();
    WaitAndRetry(p, /*alternative=*/PickReplica(*p).has_value());
  }

  // Retries now when another replica is up, else after a backoff (or when the replica set
  // changes), within the outage's budget and the attempts (RetryPolicy).
  void WaitAndRetry(const ProxiedPtr& p, bool alternative) {
    RetryPolicy::Decision next = p->retry.Next(SteadyClock::now(), alternative, NextReplicaUp());
    switch (next.kind) {
      case RetryPolicy::Decision::Kind::kGiveUp:
        return GiveUp(p);
      case RetryPolicy::Decision::Kind::kRetryNow:
        asio::post(io_, [this, p] { StartAttempt(p); });
        return;
      case RetryPolicy::Decision::Kind::kWait:
        p->waiting = true;
        p->wait.expires_at(next.at);
        p->wait.async_wait([this, p](boost::system::error_code) {
          p->waiting = false;
          StartAttempt(p);
        });
        return;
    }
  }

  void WakeWaiting() {
    for (const ProxiedPtr& p : live_) {
      if (p->waiting) p->wait.cancel();
    }
  }

  void GiveUp(const ProxiedPtr& p) {
    Fail(p,
         absl::UnavailableError(StrCat("model ", options_.model, ": ", p->retry.GiveUpReason())));
  }

  // Ends `p` (once): the gauges, the latency, the access line (`status`, and the finish reason
  // or the error in `outcome`), the live set.
  bool End(const ProxiedPtr& p, int status, std::string_view outcome) {
    if (p->ended) return false;
    p->ended = true;
    if (p->attempt) CloseAttempt(p, p->attempt);
    p->wait.cancel();
    requests_.Ended(/*got_token=*/!p->tokens.empty());
    const int64_t latency_us = NowUs() - p->start_us;
    requests_.e2e.Observe(static_cast<double>(latency_us) / 1e6);
    live_.erase(p);
    LogRequestAccess({p->header.id, EndpointPath(p->request.endpoint), status,
                      static_cast<int64_t>(p->prompt.size()),
                      static_cast<int64_t>(p->tokens.size()), latency_us, outcome,
                      p->retry.attempts()});
    return true;
  }

  void Complete(const ProxiedPtr& p) {
    const FinishReason finish = p->finish.value_or(FinishReason::kLength);
    if (!End(p, 200, FinishReasonName(finish))) return;
    requests_.success.WithLabels({std::string(FinishReasonName(finish))}).Increment();
    requests_.prompt_tokens.Increment(static_cast<double>(p->prompt.size()));
    {
      MutexLock lock(&mu_);
      ++stats_.completed;
    }
    HttpExchange& x = *p->exchange;
    if (p->chunks) {
      if (!p->stream_started) {
        p->stream_started = true;
        if (!x.StartStream()) return;
      }
      if (!p->finish) {  // the end was ours (max_tokens reached across a resume)
        x.Send(p->chunks->Delta("", {}, p->prompt, finish));
      }
      x.Send(p->chunks->End(
          Usage{static_cast<int64_t>(p->prompt.size()), static_cast<int64_t>(p->tokens.size())}));
      x.EndStream();
      return;
    }
    Completion c;
    c.text = p->text;
    c.token_ids = p->tokens;
    c.prompt_token_ids = p->prompt;
    c.finish_reason = finish;
    x.Respond(JsonResponse(200, CompletionResponse(p->header, c)));
  }

  void Fail(const ProxiedPtr& p, const absl::Status& status) {
    FailWith(p, HttpStatusOf(status), ErrorEnvelope(status));
  }

  // Ends `p` with an error whose envelope (JSON) is `body`.
  void FailWith(const ProxiedPtr& p, int status, std::string body) {
    if (!End(p, status, ErrorMessageOf(body))) return;
    {
      MutexLock lock(&mu_);
      ++stats_.failed;
    }
    failures_->Increment();
    HttpExchange& x = *p->exchange;
    if (p->stream_started) {  // the client has chunks already: the error is one more event
      x.Send(ChunkBuilder::ErrorEnd(std::string_view(body)));
      x.EndStream();
      return;
    }
    x.Respond(JsonResponse(status, std::move(body)));
  }

  void Cancel(const ProxiedPtr& p) {
    // nginx's 499: the client closed the connection before the answer was whole.
    if (!End(p, 499, "the client went away")) return;
    cancelled_->Increment();
    MutexLock lock(&mu_);
    ++stats_.cancelled;
  }

  const ProxyOptions options_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread io_thread_;
  Router router_;
  std::unique_ptr<HttpServer> http_;
  const int64_t created_;

  // I/O thread only.
  ReplicaBalancer balancer_;             // I/O thread
  std::unordered_set<ProxiedPtr> live_;  // requests not ended

  mutable Mutex mu_;
  std::vector<Replica> replicas_ ABSL_GUARDED_BY(mu_);
  std::string chain_problem_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;

  MetricsRegistry metrics_;
  RequestMetrics requests_{metrics_};
  Gauge* replicas_gauge_ = nullptr;
  Counter* failures_ = nullptr;
  Counter* retries_ = nullptr;
  Counter* resumes_ = nullptr;
  Counter* cancelled_ = nullptr;
};

ResumeProxy::ResumeProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ResumeProxy::~ResumeProxy() { Stop(); }

absl::StatusOr<std::unique_ptr<ResumeProxy>> ResumeProxy::Start(ProxyOptions options) {
  CONNEX_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(std::move(options));
  CONNEX_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<ResumeProxy>(new ResumeProxy(std::move(impl)));
}

void ResumeProxy::SetReplicas(std::vector<Replica> replicas) {
  impl_->SetReplicas(std::move(replicas));
}
std::vector<Replica> ResumeProxy::replicas() const { return impl_->replicas(); }
void ResumeProxy::SetChainProblem(std::string problem) {
  impl_->SetChainProblem(std::move(problem));
}
std::string ResumeProxy::address() const { return impl_->address(); }
void ResumeProxy::Stop() { impl_->Stop(); }
ResumeProxy::Stats ResumeProxy::stats() const { return impl_->stats(); }

}  // namespace connex::serving
