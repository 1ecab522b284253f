#include "connex/chaos/load.h"

#include <cstdio>
#include <ctime>

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
  return s;
}

void Progress(const CommonOptions& o, const std::string& line) {
  if (!o.progress) return;
  std::fprintf(stderr, "[connex-chaos] %s\n", line.c_str());
  std::fflush(stderr);
}

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

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
  c.replicas = o.replicas;
  c.stages = o.stages;
  c.backend = o.backend;
  c.proxy = proxy;
  c.netns = netns;
  c.inflight = inflight;
  c.stage_env = std::move(stage_env);
  Progress(o, StrCat("starting ", o.replicas, " replicas of ", o.stages, " stages",
                     proxy ? " and the proxy" : "", netns ? ", each stage in its own netns" : "",
                     inflight > 0 ? StrCat(", K=", inflight) : ""));
  return Cluster::Start(std::move(c));
}

void Load::Issue(uint64_t index, RequestSpec spec, HostPort at, std::string target, int replica,
                 int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  auto o = std::make_shared<Outcome>();
  o->index = index;
  o->spec = std::move(spec);
  o->target = std::move(target);
  o->replica = replica;
  outcomes_.push_back(o);
  auto tokens = std::make_shared<std::atomic<int>>(0);
  tokens_.push_back(tokens);
  threads_.emplace_back([o, at, timeout_ms, tokens, this] {
    o->result = StreamCompletion(at, o->spec.Body(model_), kIdleTimeoutMs, timeout_ms,
                                 [&tokens](int32_t) { tokens->fetch_add(1); });
    done_.fetch_add(1);
  });
}

bool Load::AllHaveTokens(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < outcomes_.size(); ++i) {
    if (tokens_[i]->load() < n) return false;
  }
  return true;
}

size_t Load::issued() {
  std::lock_guard<std::mutex> lock(mu_);
  return outcomes_.size();
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

// Compares every completed request with its reference; fills `correct` and `comparison`.
absl::Status Check(const CommonOptions& o, const std::string& model_path,
                   std::vector<std::shared_ptr<Outcome>>& outcomes) {
  References refs(o.bin_dir + "/connex-generate", model_path, o.stages, o.work_dir);
  std::vector<RequestSpec> specs;
  for (const auto& out : outcomes) {
    if (out->result.ok()) specs.push_back(out->spec);
  }
  Progress(o, StrCat("computing the references of ", specs.size(), " completed requests"));
  if (absl::Status s = refs.Compute(specs); !s.ok()) return s;
  for (auto& out : outcomes) {
    if (!out->result.ok()) continue;
    const std::vector<int32_t>* want = refs.Find(out->spec);
    if (want == nullptr) return absl::InternalError("no reference for " + out->spec.prompt);
    out->comparison = CompareTokens(out->result.tokens, *want);
    out->correct = out->comparison.mismatched == 0;
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
          {"tokens_compared", compared},
          {"mismatched_tokens", mismatched}};
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
