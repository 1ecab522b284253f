#include "connex/chaos/campaigns.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "connex/base/stats.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/chaos/cluster.h"
#include "connex/chaos/http_client.h"
#include "connex/chaos/reference.h"

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
constexpr int64_t kIdleTimeoutMs = 60'000;  // a client waits this long for any byte

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

std::string IsoNow() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
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
                                                      std::vector<std::string> stage_env = {}) {
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

// One request as issued and as it went.
struct Outcome {
  uint64_t index = 0;
  RequestSpec spec;
  std::string target;  // "proxy" or "replica N"
  int replica = -1;    // when sent to a replica directly
  StreamResult result;
  bool correct = false;  // completed with exactly the reference tokens
  Comparison comparison;
};

// Runs requests on their own threads; Wait() joins them.
class Load {
 public:
  void Issue(uint64_t index, RequestSpec spec, HostPort at, std::string target, int replica,
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
  void set_model(std::string model) { model_ = std::move(model); }
  // Whether every request issued so far has `n` tokens or has ended.
  bool AllHaveTokens(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < outcomes_.size(); ++i) {
      if (tokens_[i]->load() < n) return false;
    }
    return true;
  }
  size_t issued() {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_.size();
  }
  size_t done() const { return done_.load(); }
  std::vector<std::shared_ptr<Outcome>> Wait() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_;
  }

 private:
  std::mutex mu_;
  std::string model_ = "tiny";
  std::vector<std::shared_ptr<Outcome>> outcomes_;
  std::vector<std::shared_ptr<std::atomic<int>>> tokens_;
  std::vector<std::thread> threads_;
  std::atomic<size_t> done_{0};
};

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

// The stage's per-epoch execution record (connex_stage_epoch_* families): steps executed under
// `epoch`, and the monotonic time of the last; nullopt when the stage does not report it.
struct EpochSteps {
  double steps = 0;
  double last_step_ns = 0;
};
std::optional<EpochSteps> StepsUnder(const std::map<std::string, double>& m, uint64_t epoch) {
  const std::string label = StrCat("{epoch=\"", epoch, "\"}");
  auto steps = m.find("connex_stage_epoch_steps_executed_total" + label);
  auto last = m.find("connex_stage_epoch_last_step_monotonic_seconds" + label);
  if (steps == m.end() || last == m.end()) return std::nullopt;
  return EpochSteps{steps->second, last->second * 1e9};
}

// Sends `n` requests (indices from `first`) so that they are in flight together: through the
// proxy when `via_proxy`, else split over the replicas' stage 0s.
void IssueBatch(Load& load, Cluster& c, const CommonOptions& o, uint64_t first, int n,
                bool via_proxy) {
  for (int i = 0; i < n; ++i) {
    const uint64_t index = first + static_cast<uint64_t>(i);
    if (via_proxy) {
      load.Issue(index, SpecFor(index, o.max_tokens), *c.proxy(), "proxy", -1,
                 o.request_timeout_ms);
    } else {
      const uint32_t r = static_cast<uint32_t>(i) % o.replicas;
      load.Issue(index, SpecFor(index, o.max_tokens), c.api(r), StrCat("replica ", r),
                 static_cast<int>(r), o.request_timeout_ms);
    }
  }
}

}  // namespace

absl::StatusOr<Fault> ParseFault(const std::string& name) {
  if (name == "kill") return Fault::kKill;
  if (name == "stop") return Fault::kStop;
  if (name == "partition") return Fault::kPartition;
  if (name == "drain") return Fault::kDrain;
  return absl::InvalidArgumentError("--fault " + name +
                                    ": expected kill, stop, partition or drain");
}

std::string FaultName(Fault fault) {
  switch (fault) {
    case Fault::kKill:
      return "kill";
    case Fault::kStop:
      return "stop";
    case Fault::kPartition:
      return "partition";
    case Fault::kDrain:
      return "drain";
  }
  return "?";
}

absl::StatusOr<json> RunFailover(const FailoverOptions& f) {
  const CommonOptions& o = f.common;
  json record = {{"campaign", "failover"}, {"machine", Machine()}};
  record["options"] = CommonJson(o);
  record["options"].update({{"runs", f.runs},
                            {"kill_stage", f.kill_stage < 0 ? json("any") : json(f.kill_stage)},
                            {"fault", FaultName(f.fault)},
                            {"batch", f.batch},
                            {"inflight", f.inflight}});
  if (!o.directory.empty()) {
    return absl::InvalidArgumentError(
        "failover --directory: faults need the processes connex-chaos starts itself");
  }
  if (f.kill_stage >= static_cast<int>(o.stages)) {
    return absl::InvalidArgumentError(
        StrCat("--kill-stage ", f.kill_stage, ": the pipeline has ", o.stages, " stages"));
  }
  const bool netns = f.fault == Fault::kPartition;
  if (netns) {
    if (absl::Status can = NetnsAvailable(); !can.ok()) {
      record["skipped"] = "network namespaces cannot be made here: " + std::string(can.message());
      record["ok"] = true;
      Progress(o, "skipped: " + record["skipped"].get<std::string>());
      return record;
    }
  }
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> c,
                          StartCluster(o, /*proxy=*/true, f.inflight, netns));
  std::vector<std::shared_ptr<Outcome>> all;
  json runs = json::array();
  std::vector<std::string> problems;
  std::vector<double> next_token_all;    // every affected request of every run
  std::vector<double> next_token_worst;  // the slowest affected request of each run
  int64_t fence_violations = 0, fence_checked = 0;
  uint64_t next_index = 0;
  const int fault_after = std::max(2, o.max_tokens / 8);  // tokens each request has first
  for (int run = 0; run < f.runs; ++run) {
    const uint32_t stage = f.kill_stage >= 0 ? static_cast<uint32_t>(f.kill_stage) : run % o.stages;
    const uint32_t replica = (run / o.stages) % o.replicas;
    const bool via_proxy = stage == 0;  // a dead stage 0 is covered by the proxy alone
    const uint64_t epoch = c->DirectoryEpoch(stage, replica);
    double reprefills_before = 0;
    for (uint32_t r = 0; r < o.replicas; ++r) {
      if (auto m = c->Metrics(0, r); m.ok())
        reprefills_before += (*m)["connex_stage_reprefills_total"];
    }
    Load load;
    load.set_model(c->options().model_name);
    IssueBatch(load, *c, o, next_index, f.batch, via_proxy);
    next_index += static_cast<uint64_t>(f.batch);
    WaitUntil([&] { return load.AllHaveTokens(fault_after) || load.done() > 0; },
              o.request_timeout_ms, 1);
    const int64_t t_fault = MonotonicNowNs();
    json r = {{"run", run},
              {"stage", stage},
              {"replica", replica},
              {"epoch", epoch},
              {"via", via_proxy ? "proxy" : "direct"}};
    absl::Status injected;
    int64_t t_back = 0;  // SIGCONT / link up
    switch (f.fault) {
      case Fault::kKill:
        injected = c->Kill(stage, replica);
        break;
      case Fault::kStop:
        injected = c->Stop(stage, replica);
        break;
      case Fault::kPartition:
        injected = c->Partition(stage, replica);
        break;
      case Fault::kDrain: {
        // connexctl drain: the stage finishes or hands over what it has and exits 0 by itself.
        absl::StatusOr<int> code = c->Drain(stage, replica);
        if (!code.ok()) {
          problems.push_back(StrCat("run ", run, ": ", code.status().message()));
        } else {
          r["exit_code"] = *code;
          r["exited_ms"] = Ms(MonotonicNowNs() - t_fault);
          if (*code != 0) {
            problems.push_back(StrCat("run ", run, ": the drained stage ", stage, "/r", replica,
                                      " exited ", *code));
          }
        }
        break;
      }
    }
    if (!injected.ok()) return injected;
    if (f.fault != Fault::kKill && f.fault != Fault::kDrain) {
      // Hung or cut off until the others have replaced it, then back.
      const bool replaced =
          WaitUntil([&] { return c->DirectoryEpoch(stage, replica) != epoch; }, 60'000, 5);
      r["replaced_ms"] = Ms(MonotonicNowNs() - t_fault);
      if (!replaced) problems.push_back(StrCat("run ", run, ": never replaced in the directory"));
      t_back = MonotonicNowNs();
      absl::Status back =
          f.fault == Fault::kStop ? c->Resume(stage, replica) : c->Heal(stage, replica);
      if (!back.ok()) return back;
    }
    std::vector<std::shared_ptr<Outcome>> outcomes = load.Wait();
    // The fault's cost, per affected request: from the fault to its next token. Affected: in
    // flight at the fault, on the faulted replica (through the proxy: the replica the answer
    // began on, its X-Connex-Replica header; the requests of the other replica never waited).
    std::vector<double> next_token;
    const std::string faulted_lid = c->lid(stage, replica).ToString() + "@";
    for (const auto& out : outcomes) {
      if (out->replica >= 0 && out->replica != static_cast<int>(replica)) continue;
      if (out->replica < 0 && out->result.began_on.rfind(faulted_lid, 0) != 0) continue;
      const auto& ts = out->result.token_ns;
      auto after = std::upper_bound(ts.begin(), ts.end(), t_fault);
      if (after == ts.begin() && ts.empty()) continue;
      if (after == ts.end()) continue;  // ended before the fault, or never resumed (an error)
      next_token.push_back(Ms(*after - t_fault));
    }
    if (!next_token.empty()) {
      next_token_worst.push_back(*std::max_element(next_token.begin(), next_token.end()));
      next_token_all.insert(next_token_all.end(), next_token.begin(), next_token.end());
    }
    r["fault_to_next_token_ms"] = Dist(next_token);
    r["fault_to_next_token_values_ms"] = next_token;
    // Back to full strength for the next run.
    if (f.fault == Fault::kKill || f.fault == Fault::kDrain) {
      if (absl::Status s = c->Restart(stage, replica); !s.ok()) return s;
    } else {
      const bool rejoined = WaitUntil(
          [&] {
            uint64_t now = c->DirectoryEpoch(stage, replica);
            return now != 0 && now != epoch;
          },
          60'000, 5);
      if (!rejoined) problems.push_back(StrCat("run ", run, ": the resumed stage never rejoined"));
      // Fencing: nothing executed under the replaced epoch once the process was back.
      absl::StatusOr<std::map<std::string, double>> m = c->Metrics(stage, replica);
      std::optional<EpochSteps> under = m.ok() ? StepsUnder(*m, epoch) : std::nullopt;
      if (!under) {
        problems.push_back(StrCat("run ", run, ": stage ", stage, "/r", replica,
                                  " reports no steps of epoch ", epoch,
                                  m.ok() ? "" : StrCat(" (", m.status().message(), ")")));
      } else {
        ++fence_checked;
        const bool violated = under->last_step_ns > static_cast<double>(t_back);
        fence_violations += violated;
        r["fenced"] = {{"steps_under_old_epoch", under->steps},
                       {"executed_after_resume", violated}};
        if (violated) {
          problems.push_back(StrCat("run ", run, ": stage ", stage, "/r", replica,
                                    " executed a step under epoch ", epoch,
                                    " after it was replaced and resumed"));
        }
      }
    }
    if (absl::Status s = c->WaitAllHealthy(60'000); !s.ok()) return s;
    double reprefills_after = 0;
    for (uint32_t rr = 0; rr < o.replicas; ++rr) {
      if (stage == 0 && rr == replica && (f.fault == Fault::kKill || f.fault == Fault::kDrain)) {
        continue;
      }
      if (auto m = c->Metrics(0, rr); m.ok())
        reprefills_after += (*m)["connex_stage_reprefills_total"];
    }
    r["reprefills"] = std::max(0.0, reprefills_after - reprefills_before);
    int failed = 0;
    for (const auto& out : outcomes) failed += !out->result.ok();
    r["requests"] = outcomes.size();
    r["failed"] = failed;
    runs.push_back(r);
    all.insert(all.end(), outcomes.begin(), outcomes.end());
    Progress(o, StrCat("run ", run + 1, "/", f.runs, ": ", FaultName(f.fault), " stage ", stage,
                       " of replica ", replica, ", ", outcomes.size() - failed, "/",
                       outcomes.size(), " completed, next token after ",
                       next_token.empty() ? std::string("-")
                                          : StrCat(static_cast<int>(*std::max_element(
                                                       next_token.begin(), next_token.end())),
                                                   " ms (worst)")));
  }
  const std::string model_path = c->model_path();
  c.reset();
  if (absl::Status s = Check(o, model_path, all); !s.ok()) return s;
  // Mismatches and failures, per run.
  for (size_t i = 0; i < runs.size(); ++i) {
    int64_t mismatched = 0, compared = 0;
    for (int k = 0; k < f.batch; ++k) {
      const auto& out = all[i * static_cast<size_t>(f.batch) + static_cast<size_t>(k)];
      mismatched += out->comparison.mismatched;
      compared += out->comparison.compared;
    }
    runs[i]["tokens_compared"] = compared;
    runs[i]["mismatched_tokens"] = mismatched;
  }
  json totals = Totals(all);
  totals["goodput"] =
      all.empty() ? 0.0 : totals["correct"].get<double>() / static_cast<double>(all.size());
  totals["fault_to_next_token_ms"] = Dist(next_token_all);
  totals["worst_fault_to_next_token_ms"] = Dist(next_token_worst);
  double reprefills = 0;
  for (const auto& r : runs) reprefills += r["reprefills"].get<double>();
  totals["reprefills"] = reprefills;
  if (f.fault == Fault::kStop || f.fault == Fault::kPartition) {
    totals["fence_checks"] = fence_checked;
    totals["steps_executed_by_fenced_processes"] = fence_violations;
  }
  json failures = json::array();
  for (const auto& out : all) {
    if (!out->result.ok()) failures.push_back(Failure(*out));
    if (out->result.ok() && !out->correct) {
      problems.push_back(StrCat("request ", out->index, ": ", out->comparison.mismatched, " of ",
                                out->comparison.compared, " tokens differ"));
    }
  }
  if (totals["failed"].get<int64_t>() > 0) {
    problems.push_back(StrCat(totals["failed"].get<int64_t>(), " requests did not complete"));
  }
  record["runs"] = runs;
  record["totals"] = totals;
  record["failures"] = failures;
  record["problems"] = problems;
  record["ok"] = problems.empty();
  return record;
}

absl::StatusOr<json> RunChurn(const ChurnOptions& ch) {
  const CommonOptions& o = ch.common;
  json record = {{"campaign", "churn"}, {"machine", Machine()}};
  record["options"] = CommonJson(o);
  record["options"].update({{"qps", ch.qps},
                            {"duration_s", ch.duration_s},
                            {"kill_every_s", ch.kill_every_s},
                            {"proxy", ch.proxy},
                            {"soft", ch.soft}});
  if (!o.directory.empty()) {
    return absl::InvalidArgumentError(
        "churn --directory: faults need the processes connex-chaos starts itself");
  }
  if (ch.qps <= 0 || ch.duration_s <= 0 || ch.kill_every_s <= 0) {
    return absl::InvalidArgumentError("churn: --qps, --duration and --kill-every must be > 0");
  }
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> c, StartCluster(o, /*proxy=*/true, 0, false));
  Load load;
  load.set_model(c->options().model_name);
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(ch.qps);
  const int64_t t0 = MonotonicNowNs();
  const int64_t end = t0 + static_cast<int64_t>(ch.duration_s * 1e9);
  // Fault times, and which replica was down when.
  struct Down {
    uint32_t replica;
    int64_t from_ns, to_ns;
  };
  std::vector<Down> downs;
  std::mutex downs_mu;
  std::atomic<bool> stop_dispatch{false};
  std::atomic<uint32_t> rr{0};
  std::vector<bool> replica_down(o.replicas, false);
  std::mutex down_mu;
  // The dispatcher issues requests at Poisson arrival times; the main thread injects faults.
  std::thread dispatcher([&] {
    int64_t next = t0;
    uint64_t index = 0;
    while (!stop_dispatch.load()) {
      next += static_cast<int64_t>(gap(rng) * 1e9);
      if (next >= end) break;
      while (MonotonicNowNs() < next && !stop_dispatch.load()) {
        std::this_thread::sleep_for(std::chrono::microseconds(
            std::min<int64_t>(5000, std::max<int64_t>(1, (next - MonotonicNowNs()) / 1000))));
      }
      if (ch.proxy) {
        load.Issue(index, SpecFor(index, o.max_tokens), *c->proxy(), "proxy", -1,
                   o.request_timeout_ms);
      } else {
        // A directory-aware client without the proxy: round robin over the replicas whose
        // stage 0 is up.
        int chosen = -1;
        {
          std::lock_guard<std::mutex> lock(down_mu);
          for (uint32_t k = 0; k < o.replicas; ++k) {
            uint32_t cand = (rr.fetch_add(1)) % o.replicas;
            if (!replica_down[cand]) {
              chosen = static_cast<int>(cand);
              break;
            }
          }
        }
        if (chosen < 0) chosen = 0;
        load.Issue(index, SpecFor(index, o.max_tokens), c->api(static_cast<uint32_t>(chosen)),
                   StrCat("replica ", chosen), chosen, o.request_timeout_ms);
      }
      ++index;
    }
  });
  const double down_s = ch.kill_every_s / 2;
  int fault_no = 0;
  absl::Status failure;
  for (double at = ch.kill_every_s; at < ch.duration_s && failure.ok(); at += ch.kill_every_s) {
    const int64_t t_fault = t0 + static_cast<int64_t>(at * 1e9);
    while (MonotonicNowNs() < t_fault) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const uint32_t victim = static_cast<uint32_t>(fault_no++) % o.replicas;
    {
      std::lock_guard<std::mutex> lock(down_mu);
      replica_down[victim] = true;
    }
    const int64_t from = MonotonicNowNs();
    Progress(o, StrCat(static_cast<int64_t>(Ms(from - t0) / 1000),
                       " s: ", ch.soft ? "replica leaves: " : "killing replica ", victim, " (",
                       load.issued(), " issued, ", load.done(), " done)"));
    for (uint32_t s = 0; s < o.stages && failure.ok(); ++s) {
      failure = ch.soft ? c->Leave(s, victim) : c->Kill(s, victim);
    }
    const int64_t back_at = from + static_cast<int64_t>(down_s * 1e9);
    while (MonotonicNowNs() < back_at) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (uint32_t s = o.stages; s-- > 0 && failure.ok();) failure = c->Restart(s, victim);
    if (failure.ok()) failure = c->WaitHealthy(victim, 60'000);
    {
      std::lock_guard<std::mutex> lock(down_mu);
      replica_down[victim] = false;
    }
    std::lock_guard<std::mutex> lock(downs_mu);
    downs.push_back({victim, from, MonotonicNowNs()});
  }
  dispatcher.join();
  std::vector<std::shared_ptr<Outcome>> outcomes = load.Wait();
  if (!failure.ok()) return failure;
  const std::string model_path = c->model_path();
  c.reset();
  if (absl::Status s = Check(o, model_path, outcomes); !s.ok()) return s;
  json totals = Totals(outcomes);
  const double issued = static_cast<double>(outcomes.size());
  totals["goodput"] = issued == 0 ? 0.0 : totals["correct"].get<double>() / issued;
  json lost = json::array();
  for (const auto& out : outcomes) {
    if (out->correct) continue;
    json l = Failure(*out);
    if (out->result.ok()) l["error"] = "completed with tokens that differ from the reference";
    // Where it was: the replica it went to, and whether that replica was down meanwhile.
    for (const Down& d : downs) {
      if (out->result.start_ns <= d.to_ns && out->result.end_ns >= d.from_ns) {
        l["during_fault_of_replica"] = d.replica;
      }
    }
    lost.push_back(l);
  }
  std::vector<std::string> problems;
  if (ch.proxy && totals["correct"].get<int64_t>() != totals["issued"].get<int64_t>()) {
    problems.push_back(
        StrCat(lost.size(), " of ", outcomes.size(), " requests lost or wrong with the proxy"));
  }
  if (totals["mismatched_tokens"].get<int64_t>() > 0) {
    problems.push_back(StrCat(totals["mismatched_tokens"].get<int64_t>(), " mismatched tokens"));
  }
  record["faults"] = downs.size();
  record["totals"] = totals;
  record["latency"] = Latencies(outcomes);
  record["lost"] = lost;
  record["problems"] = problems;
  record["ok"] = problems.empty();
  return record;
}

namespace {

// Open-loop load at `qps` for `duration_s` over the replicas' stage 0s (round robin).
std::vector<std::shared_ptr<Outcome>> OpenLoop(Cluster& c, const CommonOptions& o, double qps,
                                               double duration_s, uint64_t* next_index) {
  Load load;
  load.set_model(c.options().model_name);
  // The same arrivals for the same (seed, rate), whatever ran before: every K sees one load.
  std::mt19937_64 rng(o.seed * 1'000'003 + static_cast<uint64_t>(qps * 1000));
  std::exponential_distribution<double> gap(qps);
  const int64_t t0 = MonotonicNowNs();
  const int64_t end = t0 + static_cast<int64_t>(duration_s * 1e9);
  int64_t next = t0;
  uint32_t r = 0;
  while (true) {
    next += static_cast<int64_t>(gap(rng) * 1e9);
    if (next >= end) break;
    while (MonotonicNowNs() < next) {
      std::this_thread::sleep_for(std::chrono::microseconds(
          std::min<int64_t>(5000, std::max<int64_t>(1, (next - MonotonicNowNs()) / 1000))));
    }
    const uint64_t index = (*next_index)++;
    load.Issue(index, SpecFor(index, o.max_tokens), c.api(r), StrCat("replica ", r),
               static_cast<int>(r), o.request_timeout_ms);
    r = (r + 1) % c.options().replicas;
  }
  return load.Wait();
}

// `clients` clients, each sending its next request as soon as the last ended, for
// `duration_s`. Returns the outcomes and the wall time.
std::vector<std::shared_ptr<Outcome>> ClosedLoop(Cluster& c, const CommonOptions& o, int clients,
                                                 double duration_s, uint64_t* next_index,
                                                 double* wall_s) {
  std::mutex mu;
  std::vector<std::shared_ptr<Outcome>> outcomes;
  std::atomic<uint64_t> index{*next_index};
  const int64_t t0 = MonotonicNowNs();
  const int64_t end = t0 + static_cast<int64_t>(duration_s * 1e9);
  std::vector<std::thread> threads;
  for (int k = 0; k < clients; ++k) {
    threads.emplace_back([&, k] {
      const uint32_t r = static_cast<uint32_t>(k) % c.options().replicas;
      while (MonotonicNowNs() < end) {
        auto out = std::make_shared<Outcome>();
        out->index = index.fetch_add(1);
        out->spec = SpecFor(out->index, o.max_tokens);
        out->target = StrCat("replica ", r);
        out->replica = static_cast<int>(r);
        out->result = StreamCompletion(c.api(r), out->spec.Body(c.options().model_name),
                                       kIdleTimeoutMs, o.request_timeout_ms);
        std::lock_guard<std::mutex> lock(mu);
        outcomes.push_back(out);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  *wall_s = static_cast<double>(MonotonicNowNs() - t0) / 1e9;
  *next_index = index.load();
  return outcomes;
}

}  // namespace

absl::StatusOr<json> RunSteady(const SteadyOptions& st) {
  const CommonOptions& o = st.common;
  json record = {{"campaign", "steady"}, {"machine", Machine()}};
  record["options"] = CommonJson(o);
  record["options"].update({{"qps", st.qps},
                            {"inflight", st.inflight},
                            {"duration_s", st.duration_s},
                            {"closed_loop_clients", st.closed_loop_clients}});
  json open = json::array(), closed = json::array();
  std::vector<std::vector<std::shared_ptr<Outcome>>> open_outcomes, closed_outcomes;
  std::vector<std::shared_ptr<Outcome>> all;
  std::vector<std::string> problems;
  std::string model_path;
  uint64_t next_index = 0;
  if (!o.directory.empty() && st.inflight.size() != 1) {
    return absl::InvalidArgumentError(
        "steady --directory: the deployment's K is its own; give one --inflight (what it runs)");
  }
  for (int k : st.inflight) {
    // Every K gets the same requests (prompts, sampling) in the same order.
    next_index = 0;
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> c, StartCluster(o, /*proxy=*/false, k, false));
    model_path = c->model_path();
    record["options"]["replicas"] = c->options().replicas;  // --directory: as found
    if (c->attached()) record["options"]["directory"] = o.directory;
    for (double qps : st.qps) {
      Progress(o, StrCat("K=", k, ": open loop at ", qps, " QPS for ", st.duration_s, " s"));
      const int64_t t0 = MonotonicNowNs();
      auto outcomes = OpenLoop(*c, o, qps, st.duration_s, &next_index);
      const double wall = static_cast<double>(MonotonicNowNs() - t0) / 1e9;
      json row = {{"inflight", k}, {"qps", qps}, {"wall_s", wall}};
      row["latency"] = Latencies(outcomes);
      row["tokens_per_s"] = row["latency"]["tokens"].get<double>() / wall;
      open.push_back(row);
      open_outcomes.push_back(outcomes);
      all.insert(all.end(), outcomes.begin(), outcomes.end());
    }
    Progress(o, StrCat("K=", k, ": closed loop, ", st.closed_loop_clients, " clients for ",
                       st.duration_s, " s"));
    double wall = 0;
    auto outcomes = ClosedLoop(*c, o, st.closed_loop_clients, st.duration_s, &next_index, &wall);
    json row = {{"inflight", k}, {"clients", st.closed_loop_clients}, {"wall_s", wall}};
    row["latency"] = Latencies(outcomes);
    row["tokens_per_s"] = row["latency"]["tokens"].get<double>() / wall;
    closed.push_back(row);
    closed_outcomes.push_back(outcomes);
    all.insert(all.end(), outcomes.begin(), outcomes.end());
  }
  if (absl::Status s = Check(o, model_path, all); !s.ok()) return s;
  for (size_t i = 0; i < open.size(); ++i) open[i]["totals"] = Totals(open_outcomes[i]);
  for (size_t i = 0; i < closed.size(); ++i) closed[i]["totals"] = Totals(closed_outcomes[i]);
  json totals = Totals(all);
  if (totals["failed"].get<int64_t>() > 0) {
    problems.push_back(StrCat(totals["failed"].get<int64_t>(), " requests failed"));
  }
  if (totals["mismatched_tokens"].get<int64_t>() > 0) {
    problems.push_back(StrCat(totals["mismatched_tokens"].get<int64_t>(), " mismatched tokens"));
  }
  double k1 = 0;
  for (const auto& row : closed) {
    if (row["inflight"] == 1) k1 = row["tokens_per_s"].get<double>();
  }
  if (k1 > 0) {
    for (auto& row : closed) row["speedup_vs_k1"] = row["tokens_per_s"].get<double>() / k1;
  }
  record["open_loop"] = open;
  record["closed_loop"] = closed;
  record["totals"] = totals;
  record["problems"] = problems;
  record["ok"] = problems.empty();
  return record;
}

absl::StatusOr<json> RunOverload(const OverloadOptions& ov) {
  const CommonOptions& o = ov.common;
  json record = {{"campaign", "overload"}, {"machine", Machine()}};
  record["options"] = CommonJson(o);
  record["options"].update({{"qps", ov.qps},
                            {"duration_s", ov.duration_s},
                            {"kv_budget", ov.kv_budget},
                            {"queue_max", ov.queue_max}});
  if (!o.directory.empty()) {
    return absl::InvalidArgumentError("overload --directory: it sets the stages' budgets itself");
  }
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> c,
                          StartCluster(o, /*proxy=*/false, 0, false,
                                       {"CONNEX_STAGE_KV_BUDGET_BYTES=" + ov.kv_budget,
                                        StrCat("CONNEX_STAGE_QUEUE_MAX=", ov.queue_max)}));
  // /health of every stage 0, every health_every_ms, while the load runs.
  std::atomic<bool> probing{true};
  std::vector<double> health_ms;
  int64_t health_failed = 0;
  std::thread prober([&] {
    while (probing.load()) {
      for (uint32_t r = 0; r < c->options().replicas; ++r) {
        const int64_t t0 = MonotonicNowNs();
        absl::StatusOr<HttpReply> reply = HttpGet(c->api(r), "/health", 5000);
        if (!reply.ok() || reply->status != 200) {
          ++health_failed;
          continue;
        }
        health_ms.push_back(Ms(MonotonicNowNs() - t0));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(ov.health_every_ms));
    }
  });
  Progress(o, StrCat("open loop at ", ov.qps, " QPS for ", ov.duration_s, " s, stage 0 budget ",
                     ov.kv_budget, " and ", ov.queue_max, " queued"));
  uint64_t next_index = 0;
  std::vector<std::shared_ptr<Outcome>> outcomes =
      OpenLoop(*c, o, ov.qps, ov.duration_s, &next_index);
  probing = false;
  prober.join();
  json rss = json::array();
  for (uint32_t r = 0; r < c->options().replicas; ++r) {
    for (uint32_t s = 0; s < c->options().stages; ++s) {
      rss.push_back({{"stage", s}, {"replica", r}, {"peak_rss_mb", c->PeakRssBytes(s, r) / 1e6}});
    }
  }
  const std::string model_path = c->model_path();
  c.reset();
  std::vector<std::shared_ptr<Outcome>> admitted;
  int64_t refused = 0, refused_without_retry_after = 0;
  std::vector<std::string> problems;
  for (const auto& out : outcomes) {
    if (out->result.http_status == 429) {
      ++refused;
      if (out->result.retry_after.empty()) ++refused_without_retry_after;
      continue;
    }
    admitted.push_back(out);
  }
  if (absl::Status s = Check(o, model_path, admitted); !s.ok()) return s;
  json totals = Totals(admitted);
  totals["offered"] = outcomes.size();
  totals["refused_429"] = refused;
  totals["refused_without_retry_after"] = refused_without_retry_after;
  totals["health"] = Dist(health_ms);
  totals["health_failed"] = health_failed;
  if (refused_without_retry_after > 0) {
    problems.push_back(StrCat(refused_without_retry_after, " 429s without Retry-After"));
  }
  if (totals["failed"].get<int64_t>() > 0) {
    problems.push_back(StrCat(totals["failed"].get<int64_t>(),
                              " admitted requests failed (a refusal must be a 429)"));
  }
  if (totals["mismatched_tokens"].get<int64_t>() > 0) {
    problems.push_back(StrCat(totals["mismatched_tokens"].get<int64_t>(), " mismatched tokens"));
  }
  if (health_failed > 0) problems.push_back(StrCat(health_failed, " /health probes failed"));
  json failures = json::array();
  for (const auto& out : admitted) {
    if (!out->result.ok()) failures.push_back(Failure(*out));
  }
  record["totals"] = totals;
  record["peak_rss"] = rss;
  record["failures"] = failures;
  record["problems"] = problems;
  record["ok"] = problems.empty();
  return record;
}

absl::StatusOr<json> RunProxyCost(const ProxyCostOptions& pc) {
  const CommonOptions& o = pc.common;
  json record = {{"campaign", "proxy-cost"}, {"machine", Machine()}};
  record["options"] = CommonJson(o);
  record["options"]["requests"] = pc.requests;
  if (!o.directory.empty() && o.proxy_address.empty()) {
    return absl::InvalidArgumentError("proxy-cost --directory: give --proxy-address too");
  }
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> c, StartCluster(o, /*proxy=*/true, 0, false));
  record["options"]["replicas"] = c->options().replicas;  // --directory: as found
  if (c->attached()) record["options"]["directory"] = o.directory;
  std::vector<std::shared_ptr<Outcome>> direct, proxied, all;
  // One request at a time, alternating the paths (the same request index on each), so that
  // both see the same machine; direct requests go to the replicas in turn.
  for (int i = 0; i < pc.requests; ++i) {
    for (int path = 0; path < 2; ++path) {
      auto out = std::make_shared<Outcome>();
      out->index = static_cast<uint64_t>(i);
      out->spec = SpecFor(out->index, o.max_tokens);
      const uint32_t r = static_cast<uint32_t>(i) % c->options().replicas;
      const HostPort at = path == 0 ? c->api(r) : *c->proxy();
      out->target = path == 0 ? StrCat("replica ", r) : "proxy";
      out->result = StreamCompletion(at, out->spec.Body(c->options().model_name), kIdleTimeoutMs,
                                     o.request_timeout_ms);
      (path == 0 ? direct : proxied).push_back(out);
      all.push_back(out);
    }
    if ((i + 1) % 10 == 0) Progress(o, StrCat(i + 1, "/", pc.requests, " request pairs"));
  }
  const std::string model_path = c->model_path();
  c.reset();
  if (absl::Status s = Check(o, model_path, all); !s.ok()) return s;
  json d = Latencies(direct), p = Latencies(proxied);
  record["direct"] = d;
  record["proxy"] = p;
  record["added_ms"] = {
      {"e2e_mean", p["e2e_ms"]["mean"].get<double>() - d["e2e_ms"]["mean"].get<double>()},
      {"e2e_p99", p["e2e_ms"]["p99"].get<double>() - d["e2e_ms"]["p99"].get<double>()},
      {"ttft_mean", p["ttft_ms"]["mean"].get<double>() - d["ttft_ms"]["mean"].get<double>()}};
  // Per pair (the same request, one right after the other): proxy minus direct. Robust to the
  // machine's drift, which the difference of the two means is not.
  std::vector<double> e2e_diff, ttft_diff;
  for (size_t i = 0; i < direct.size(); ++i) {
    const StreamResult& a = direct[i]->result;
    const StreamResult& b = proxied[i]->result;
    if (!a.ok() || !b.ok() || a.token_ns.empty() || b.token_ns.empty()) continue;
    e2e_diff.push_back(Ms(b.end_ns - b.start_ns) - Ms(a.end_ns - a.start_ns));
    ttft_diff.push_back(Ms(b.token_ns.front() - b.start_ns) - Ms(a.token_ns.front() - a.start_ns));
  }
  record["paired_added_ms"] = {{"e2e", Dist(e2e_diff)}, {"ttft", Dist(ttft_diff)}};
  json totals = Totals(all);
  std::vector<std::string> problems;
  if (totals["correct"].get<int64_t>() != totals["issued"].get<int64_t>()) {
    problems.push_back(StrCat(totals["issued"].get<int64_t>() - totals["correct"].get<int64_t>(),
                              " requests failed or differ from the reference"));
  }
  record["totals"] = totals;
  record["problems"] = problems;
  record["ok"] = problems.empty();
  return record;
}

std::string Summary(const json& r) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  auto f1 = [](double v) {
    char b[32];
    std::snprintf(b, sizeof(b), "%.1f", v);
    return std::string(b);
  };
  const std::string campaign = r.value("campaign", "?");
  line("connex-chaos " + campaign + " (" + r["machine"].value("date", "") + ", " +
       std::to_string(r["machine"].value("cores", 0)) + " cores)");
  if (r.contains("skipped")) {
    line("  SKIPPED: " + r["skipped"].get<std::string>());
    return out;
  }
  const json& t = r["totals"];
  line(StrCat("  requests: ", t["issued"].get<int64_t>(), " issued, ",
              t["completed"].get<int64_t>(), " completed, ", t["failed"].get<int64_t>(),
              " failed; tokens compared ", t["tokens_compared"].get<int64_t>(), ", mismatched ",
              t["mismatched_tokens"].get<int64_t>()));
  if (campaign == "failover") {
    const json& n = t["fault_to_next_token_ms"];
    line(StrCat("  ", r["runs"].size(), " runs of ", r["options"]["fault"].get<std::string>(),
                "; fault to next token (affected requests, n=", n["n"].get<int64_t>(), "): p50 ",
                f1(n["p50"]), " ms, p99 ", f1(n["p99"]), " ms, max ", f1(n["max"]), " ms"));
    line(StrCat("  re-prefills: ", t["reprefills"].get<double>()));
    if (t.contains("steps_executed_by_fenced_processes")) {
      line(StrCat("  fencing: ", t["steps_executed_by_fenced_processes"].get<int64_t>(), " of ",
                  t["fence_checks"].get<int64_t>(),
                  " replaced processes executed a step after they were back"));
    }
  } else if (campaign == "churn") {
    const json& l = r["latency"]["e2e_ms"];
    line(StrCat("  goodput ", f1(100 * t["goodput"].get<double>()), " % over ",
                r["faults"].get<int64_t>(), " faults (",
                r["options"]["proxy"].get<bool>() ? "with the proxy" : "without the proxy",
                r["options"]["soft"].get<bool>() ? ", soft" : "", "); e2e mean ", f1(l["mean"]),
                " ms, p99 ", f1(l["p99"]), " ms"));
    for (const auto& lost : r["lost"]) line("  lost: " + lost.dump());
  } else if (campaign == "steady") {
    for (const auto& row : r["open_loop"]) {
      line(StrCat("  K=", row["inflight"].get<int>(), " QPS ", f1(row["qps"]), ": e2e mean ",
                  f1(row["latency"]["e2e_ms"]["mean"]), " ms, p99 ",
                  f1(row["latency"]["e2e_ms"]["p99"]), " ms, TTFT mean ",
                  f1(row["latency"]["ttft_ms"]["mean"]), " ms, ", f1(row["tokens_per_s"]),
                  " tok/s"));
    }
    for (const auto& row : r["closed_loop"]) {
      line(StrCat("  K=", row["inflight"].get<int>(), " closed loop (", row["clients"].get<int>(),
                  " clients): ", f1(row["tokens_per_s"]), " tok/s",
                  row.contains("speedup_vs_k1")
                      ? StrCat(", ", f1(row["speedup_vs_k1"].get<double>()), "x K=1")
                      : ""));
    }
  } else if (campaign == "overload") {
    const json& t = r["totals"];
    line(StrCat("  offered ", t["offered"].get<int64_t>(), ", admitted ",
                t["issued"].get<int64_t>(), " (", t["correct"].get<int64_t>(),
                " exact), refused 429 ", t["refused_429"].get<int64_t>(), " (",
                t["refused_without_retry_after"].get<int64_t>(), " without Retry-After)"));
    line(StrCat("  /health (n=", t["health"]["n"].get<int64_t>(), "): p50 ", f1(t["health"]["p50"]),
                " ms, p99 ", f1(t["health"]["p99"]), " ms, max ", f1(t["health"]["max"]),
                " ms; failed ", t["health_failed"].get<int64_t>()));
    std::string rss;
    for (const auto& s : r["peak_rss"]) {
      rss += StrCat(rss.empty() ? "" : ", ", "s", s["stage"].get<int>(), "/r",
                    s["replica"].get<int>(), " ", f1(s["peak_rss_mb"]), " MB");
    }
    line("  peak RSS: " + rss);
  } else if (campaign == "proxy-cost") {
    line(StrCat("  e2e mean direct ", f1(r["direct"]["e2e_ms"]["mean"]), " ms, via proxy ",
                f1(r["proxy"]["e2e_ms"]["mean"]), " ms: added ", f1(r["added_ms"]["e2e_mean"]),
                " ms (p99 ", f1(r["added_ms"]["e2e_p99"]), " ms, TTFT ",
                f1(r["added_ms"]["ttft_mean"]), " ms)"));
    const json& pe = r["paired_added_ms"]["e2e"];
    const json& pt = r["paired_added_ms"]["ttft"];
    line(StrCat("  per pair (proxy - direct, same request): e2e median ", f1(pe["p50"]),
                " ms, mean ", f1(pe["mean"]), " ms; TTFT median ", f1(pt["p50"]), " ms, mean ",
                f1(pt["mean"]), " ms"));
  }
  for (const auto& p : r["problems"]) line("  PROBLEM: " + p.get<std::string>());
  line(r.value("ok", false) ? "  OK" : "  FAILED");
  return out;
}

}  // namespace connex::chaos
