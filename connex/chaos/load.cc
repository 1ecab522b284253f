#include "connex/chaos/load.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "connex/base/json_text.h"
#include "connex/base/stats.h"
#include "connex/base/strings.h"

namespace connex::chaos {
namespace {

using json = nlohmann::json;

// The load: request i has prompt kPrompts[i % n] + " #i"; odd requests are sampled
// (temperature 0.8, one of kSeeds), even ones greedy.
const std::vector<std::string> kPrompts = {
    "Endpoint mobility keeps in-flight work correct",
    "A logical identity outlives the process behind it",
    "The directory resolves a LID to its current address",
    "Pipeline stages hand their steps over when a peer dies",
    "Counter-based sampling makes a resumed request exact",
    "Once upon a time, in a data centre far away",
    "def fib(n): return n if n < 2 else",
    "Dear reader, this stream survives a SIGKILL",
};
constexpr uint64_t kSeeds[] = {7, 42, 1234};

std::string IsoNow() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

RequestSpec SpecFor(uint64_t i, int max_tokens) {
  RequestSpec s;
  s.prompt = kPrompts[i % kPrompts.size()] + " #" + std::to_string(i);
  s.max_tokens = max_tokens;
  if (i % 2 == 1) {
    s.temperature = 0.8f;
    s.seed = kSeeds[(i / 2) % 3];
  }
  // vLLM's sampling fields, exact across failover and resume as the others: a quarter of the
  // requests greedy with a repetition penalty, a quarter sampled with min_p and top_p.
  if (i % 4 == 2) s.repetition_penalty = 1.15f;
  if (i % 4 == 3) {
    s.min_p = 0.05f;
    s.top_p = 0.95f;
  }
  return s;
}

void Progress(const CommonOptions& o, const std::string& line) {
  if (!o.progress) return;
  std::fprintf(stderr, "[connex-chaos] %s\n", line.c_str());
  std::fflush(stderr);
}

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

std::string F1(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f", v);
  return b;
}

json Dist(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return {{"n", v.size()},
          {"mean", v.empty() ? 0.0 : sum / static_cast<double>(v.size())},
          {"p50", Percentile(v, 0.5)},
          {"p90", Percentile(v, 0.9)},
          {"p99", Percentile(v, 0.99)},
          {"max", Percentile(v, 1.0)}};
}

json Machine() { return {{"cores", std::thread::hardware_concurrency()}, {"date", IsoNow()}}; }

json CommonJson(const CommonOptions& o) {
  return {{"replicas", o.replicas},
          {"stages", o.stages},
          {"backend", o.backend},
          {"kv_standby", o.kv_standby},
          {"max_tokens", o.max_tokens},
          {"seed", o.seed},
          {"model", o.model_path.empty() ? "connex-mkmodel --layers 8 --dim 256 --heads 4 "
                                           "--kv-heads 2 --ffn 512 --seed 7"
                                         : o.model_path}};
}

absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(const CommonOptions& o, bool proxy,
                                                      int inflight, bool netns,
                                                      std::vector<std::string> stage_env) {
  if (!o.directory.empty()) {
    ClusterOptions c;
    c.model_path = o.model_path;
    c.model_name = o.model_name;
    c.stages = o.stages;
    Progress(o, "measuring the deployment of directory " + o.directory);
    return Cluster::Attach(std::move(c), o.directory, proxy ? o.proxy_address : "");
  }
  ClusterOptions c;
  c.bin_dir = o.bin_dir;
  c.work_dir = o.work_dir;
  c.model_path = o.model_path;
  c.model_name = o.model_name;
  c.replicas = o.replicas;
  c.stages = o.stages;
  c.backend = o.backend;
  c.proxy = proxy;
  c.netns = netns;
  c.inflight = inflight;
  c.kv_standby = o.kv_standby;
  c.stage_env = std::move(stage_env);
  Progress(o, StrCat("starting ", o.replicas, " replicas of ", o.stages, " stages",
                     o.kv_standby ? " with KV standby" : "", proxy ? " and the proxy" : "",
                     netns ? ", each stage in its own netns" : "",
                     inflight > 0 ? StrCat(", K=", inflight) : ""));
  return Cluster::Start(std::move(c));
}

void LiveStream::Started(int64_t ns) {
  connex::MutexLock lock(&mu_);
  view_.started = true;
  view_.start_ns = ns;
}

void LiveStream::Token(int64_t at_ns) {
  connex::MutexLock lock(&mu_);
  ++view_.tokens;
  token_ns_.push_back(at_ns);
}

void LiveStream::Ended(int64_t ns) {
  connex::MutexLock lock(&mu_);
  view_.ended = true;
  view_.end_ns = ns;
}

LiveStream::View LiveStream::Get() const {
  connex::MutexLock lock(&mu_);
  return view_;
}

std::optional<int64_t> LiveStream::FirstTokenAfter(int64_t t_ns) const {
  connex::MutexLock lock(&mu_);
  auto after = std::upper_bound(token_ns_.begin(), token_ns_.end(), t_ns);
  if (after == token_ns_.end()) return std::nullopt;
  return *after;
}

std::shared_ptr<Outcome> Load::Add(uint64_t index, RequestSpec spec, std::string target,
                                   int replica) {
  auto o = std::make_shared<Outcome>();
  o->index = index;
  o->spec = std::move(spec);
  o->target = std::move(target);
  o->replica = replica;
  std::lock_guard<std::mutex> lock(mu_);
  outcomes_.push_back(o);
  return o;
}

void Load::Run(Outcome& o, const HostPort& at, int64_t timeout_ms) {
  o.live.Started(MonotonicNowNs());
  StreamResult r = StreamCompletion(at, o.spec.Body(model_), kIdleTimeoutMs, timeout_ms,
                                    [&o](int32_t, int64_t at_ns) { o.live.Token(at_ns); });
  const int64_t end_ns = r.end_ns;
  o.result = std::move(r);
  o.live.Ended(end_ns);  // after `result`: whoever sees it ended may read it
  done_.fetch_add(1);
}

void Load::Issue(uint64_t index, RequestSpec spec, HostPort at, std::string target, int replica,
                 int64_t timeout_ms) {
  std::shared_ptr<Outcome> o = Add(index, std::move(spec), std::move(target), replica);
  std::lock_guard<std::mutex> lock(mu_);
  threads_.emplace_back([o, at, timeout_ms, this] { Run(*o, at, timeout_ms); });
}

void Load::StartClients(int clients, std::function<RequestSpec(uint64_t)> spec,
                        std::function<std::pair<HostPort, std::string>(int client)> target,
                        int64_t pause_ms, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int client = 0; client < clients; ++client) {
    threads_.emplace_back([this, client, spec, target, pause_ms, timeout_ms] {
      while (!stop_clients_.HasBeenNotified()) {
        const uint64_t index = next_client_index_.fetch_add(1);
        auto [at, name] = target(client);
        std::shared_ptr<Outcome> o = Add(index, spec(index), name, -1);
        Run(*o, at, timeout_ms);
        stop_clients_.WaitForNotificationWithTimeout(absl::Milliseconds(pause_ms));
      }
    });
  }
}

bool Load::AllHaveTokens(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& o : outcomes_) {
    if (o->live.Get().tokens < n) return false;
  }
  return true;
}

size_t Load::issued() {
  std::lock_guard<std::mutex> lock(mu_);
  return outcomes_.size();
}

std::vector<std::shared_ptr<Outcome>> Load::Outcomes() {
  std::lock_guard<std::mutex> lock(mu_);
  return outcomes_;
}

std::vector<std::shared_ptr<Outcome>> Load::Wait() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
  std::lock_guard<std::mutex> lock(mu_);
  return outcomes_;
}

namespace {

std::string Quoted(const std::string& text, size_t n) {
  json j = text.substr(0, n);
  return DumpJson(j) + (text.size() > n ? "..." : "");
}

// What differs between a completed request and connex-generate's answer, but its token ids.
std::vector<std::string> OtherDifferences(const Outcome& o, const Reference& want) {
  std::vector<std::string> why;
  const StreamResult& r = o.result;
  if (r.text != want.text) {
    why.push_back(StrCat("text differs (streamed ", Quoted(r.text, 40), ", connex-generate ",
                         Quoted(want.text, 40), ")"));
  }
  // A completion ends at one of the model's stop tokens (connex-generate says which), or at
  // max_tokens.
  if (r.finish_reason != want.finish_reason) {
    why.push_back(StrCat("finish_reason ", r.finish_reason, ", expected ", want.finish_reason));
  }
  if (r.response_ids.size() != 1) {
    std::string ids;
    for (const std::string& id : r.response_ids) ids += (ids.empty() ? "" : ", ") + id;
    why.push_back(StrCat(r.response_ids.size(), " response ids in one stream: [", ids, "]"));
  }
  // Usage: the prompt's ids (as the model's tokenizer makes them), the tokens generated.
  const int64_t prompt = want.prompt_tokens;
  const int64_t completion = static_cast<int64_t>(r.tokens.size());
  if (r.prompt_tokens != prompt || r.completion_tokens != completion ||
      r.total_tokens != prompt + completion) {
    why.push_back(StrCat("usage ", r.prompt_tokens, "/", r.completion_tokens, "/", r.total_tokens,
                         " (prompt/completion/total), expected ", prompt, "/", completion, "/",
                         prompt + completion));
  }
  return why;
}

}  // namespace

std::string Differences(const Outcome& o) {
  std::string out;
  if (o.comparison.mismatched > 0) {
    out = StrCat(o.comparison.mismatched, " of ", o.comparison.compared, " tokens differ");
  }
  for (const std::string& d : o.differences) out += (out.empty() ? "" : "; ") + d;
  return out;
}

absl::Status Check(const CommonOptions& o, const std::string& model_path,
                   std::vector<std::shared_ptr<Outcome>>& outcomes) {
  References refs(o.bin_dir + "/connex-generate", model_path, o.stages, o.work_dir);
  std::vector<RequestSpec> specs;
  for (const auto& out : outcomes) {
    if (out->result.ok()) specs.push_back(out->spec);
  }
  Progress(o, StrCat("computing the references of ", specs.size(), " completed requests"));
  return Check(refs, outcomes);
}

absl::Status Check(References& refs, std::vector<std::shared_ptr<Outcome>>& outcomes) {
  std::vector<RequestSpec> specs;
  for (const auto& out : outcomes) {
    if (out->result.ok()) specs.push_back(out->spec);
  }
  if (absl::Status s = refs.Compute(specs); !s.ok()) return s;
  for (auto& out : outcomes) {
    if (!out->result.ok()) continue;
    const Reference* want = refs.Find(out->spec);
    if (want == nullptr) return absl::InternalError("no reference for " + out->spec.prompt);
    out->comparison = CompareTokens(out->result.tokens, want->tokens);
    out->differences = OtherDifferences(*out, *want);
    out->correct = out->comparison.mismatched == 0 && out->differences.empty();
  }
  return absl::OkStatus();
}

// Totals over a set of outcomes.
json Totals(const std::vector<std::shared_ptr<Outcome>>& outcomes) {
  int64_t completed = 0, failed = 0, correct = 0, compared = 0, mismatched = 0;
  for (const auto& o : outcomes) {
    if (o->result.ok()) {
      ++completed;
      correct += o->correct;
      compared += o->comparison.compared;
      mismatched += o->comparison.mismatched;
    } else {
      ++failed;
    }
  }
  return {{"issued", outcomes.size()},
          {"completed", completed},
          {"failed", failed},
          {"correct", correct},
          {"differing", completed - correct},
          {"tokens_compared", compared},
          {"mismatched_tokens", mismatched}};
}

void AddDifferingProblem(const json& totals, std::vector<std::string>& problems) {
  if (const int64_t n = totals["differing"].get<int64_t>(); n > 0) {
    problems.push_back(StrCat(n, " completions differ from connex-generate (token ids, text, ",
                              "finish_reason, usage or response id)"));
  }
}

json Latencies(const std::vector<std::shared_ptr<Outcome>>& outcomes) {
  std::vector<double> e2e, ttft, tpot;
  int64_t tokens = 0;
  for (const auto& o : outcomes) {
    const StreamResult& r = o->result;
    if (!r.ok()) continue;
    tokens += static_cast<int64_t>(r.tokens.size());
    e2e.push_back(Ms(r.end_ns - r.start_ns));
    if (!r.token_ns.empty()) {
      ttft.push_back(Ms(r.token_ns.front() - r.start_ns));
      if (r.token_ns.size() > 1) {
        tpot.push_back(Ms(r.token_ns.back() - r.token_ns.front()) /
                       static_cast<double>(r.token_ns.size() - 1));
      }
    }
  }
  return {
      {"e2e_ms", Dist(e2e)}, {"ttft_ms", Dist(ttft)}, {"tpot_ms", Dist(tpot)}, {"tokens", tokens}};
}

json Failure(const Outcome& o) {
  return {{"request", o.index},
          {"target", o.target},
          {"error", o.result.error},
          {"tokens_received", o.result.tokens.size()}};
}

}  // namespace connex::chaos
