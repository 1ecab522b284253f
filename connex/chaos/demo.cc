// connex-chaos demo (`make demo`): the serving stack under a steady streaming load, a middle
// stage and a stage 0 SIGKILLed mid-generation and restarted under their LIDs; its report
// (README.md, "Demo").
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/load.h"

namespace connex::chaos {
namespace {

using json = nlohmann::json;

constexpr uint32_t kReplicas = 2;
constexpr uint32_t kStages = 4;
constexpr int kMaxTokens[] = {128, 192, 256};
constexpr int64_t kPauseMs = 200;  // a client's pause between two requests
constexpr int64_t kMidGenerationTimeoutMs = 60'000;
constexpr int64_t kResumeTimeoutMs = 30'000;  // streams in flight at a kill get a next token
constexpr int64_t kNoticeTimeoutMs = 10'000;  // the kill shows in a counter
constexpr int64_t kStopGraceMs = 10'000;      // each process, on SIGTERM
constexpr double kRestartedTrafficS = 60;     // after the last phase, for the restarted stage 0

// Request i: greedy or sampled as every campaign's (SpecFor), 128, 192 or 256 tokens.
RequestSpec DemoSpec(uint64_t i) { return SpecFor(i, kMaxTokens[(i / 2) % 3]); }

std::string Fixed(double v, int digits, int width = 0) {
  char b[64];
  std::snprintf(b, sizeof(b), "%*.*f", width, digits, v);
  return b;
}
std::string MsText(double ms) { return Fixed(ms, 0) + " ms"; }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A metric summed over its label sets; nullopt when absent.
std::optional<double> MetricSum(const std::map<std::string, double>& m, const std::string& name) {
  std::optional<double> sum;
  for (const auto& [key, value] : m) {
    if (key == name || (key.size() > name.size() && key.compare(0, name.size(), name) == 0 &&
                        key[name.size()] == '{')) {
      sum = sum.value_or(0) + value;
    }
  }
  return sum;
}

std::string ShellQuoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string Sampling(const RequestSpec& s) {
  return s.temperature == 0 ? std::string("greedy")
                            : StrCat("T=", Fixed(s.temperature, 1), " seed=", s.seed);
}

class Demo {
 public:
  explicit Demo(const DemoOptions& d) : d_(d), o_(d.common) {
    o_.replicas = kReplicas;
    o_.stages = kStages;
  }
  ~Demo() {
    StopProgress();
    load_.StopClients();
    cluster_.reset();  // what still streams ends at once
    load_.Wait();
  }
  absl::StatusOr<json> Run();

 private:
  // Seconds since the load began.
  double T(int64_t ns) const { return static_cast<double>(ns - load_start_ns_) / 1e9; }
  void Event(int64_t ns, const std::string& what) {
    Progress(o_, StrCat("* ", Fixed(T(ns), 1, 5), " s  ", what));
  }
  // Polls `done` until it holds; fails naming `what` after `timeout_ms`, or as soon as a process
  // of the deployment exits by itself.
  absl::Status WaitFor(const std::function<bool()>& done, int64_t timeout_ms,
                       const std::string& what);
  absl::Status Pace(double seconds) {
    const int64_t until = MonotonicNowNs() + static_cast<int64_t>(seconds * 1e9);
    return WaitFor([&] { return MonotonicNowNs() >= until; },
                   static_cast<int64_t>(seconds * 1e3) + 1000, "the load");
  }
  std::optional<double> Stage0Metric(uint32_t replica, const std::string& name);
  std::optional<double> ProxyMetric(const std::string& name);
  double Failovers();  // connex_failovers_total of the running stage 0s
  // The first not-null value of `read` above `before` within the notice timeout.
  std::optional<double> WaitForIncrease(const std::function<std::optional<double>()>& read,
                                        double before);
  absl::StatusOr<json> KillMidGeneration(uint32_t stage, uint32_t replica);
  void StartProgress();
  void StopProgress();

  const DemoOptions d_;
  CommonOptions o_;
  std::unique_ptr<Cluster> cluster_;
  Load load_;
  int64_t load_start_ns_ = 0;
  std::vector<int64_t> kill_ns_;
  std::atomic<bool> progress_on_{false};
  std::thread progress_;
};

absl::Status Demo::WaitFor(const std::function<bool()>& done, int64_t timeout_ms,
                           const std::string& what) {
  const int64_t deadline = MonotonicNowNs() + timeout_ms * 1'000'000;
  while (true) {
    CONNEX_RETURN_IF_ERROR(cluster_->CheckRunning());
    if (done()) return absl::OkStatus();
    if (MonotonicNowNs() >= deadline) {
      return absl::DeadlineExceededError(StrCat("timed out after ",
                                                Fixed(static_cast<double>(timeout_ms) / 1e3, 0),
                                                " s waiting for ", what));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::optional<double> Demo::Stage0Metric(uint32_t replica, const std::string& name) {
  if (!cluster_->running(0, replica)) return std::nullopt;
  absl::StatusOr<std::map<std::string, double>> m = cluster_->Metrics(0, replica);
  return m.ok() ? MetricSum(*m, name) : std::nullopt;
}

std::optional<double> Demo::ProxyMetric(const std::string& name) {
  if (!cluster_->proxy()) return std::nullopt;
  absl::StatusOr<HttpReply> r = HttpGet(*cluster_->proxy(), "/metrics", 5000);
  if (!r.ok() || r->status != 200) return std::nullopt;
  return MetricSum(ParseMetrics(r->body), name);
}

double Demo::Failovers() {
  double total = 0;
  for (uint32_t r = 0; r < kReplicas; ++r) {
    total += Stage0Metric(r, "connex_failovers_total").value_or(0);
  }
  return total;
}

std::optional<double> Demo::WaitForIncrease(const std::function<std::optional<double>()>& read,
                                            double before) {
  std::optional<double> after;
  const int64_t deadline = MonotonicNowNs() + kNoticeTimeoutMs * 1'000'000;
  while (MonotonicNowNs() < deadline) {
    after = read();
    if (after && *after > before) return after;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return std::nullopt;
}

absl::StatusOr<json> Demo::KillMidGeneration(uint32_t stage, uint32_t replica) {
  const std::string lid = cluster_->lid(stage, replica).ToString();
  CONNEX_RETURN_IF_ERROR(Pace(d_.phase_s));
  // Mid-generation: two streams at least have tokens and are far from their end, and the
  // victim's chain is generating (its stage 0 runs a request).
  CONNEX_RETURN_IF_ERROR(WaitFor(
      [&] {
        int mid = 0;
        for (const auto& out : load_.Outcomes()) {
          LiveStream::View v = out->live.Get();
          mid += v.started && !v.ended && v.tokens >= 8 && v.tokens <= out->spec.max_tokens - 40;
        }
        return mid >= 2 && Stage0Metric(replica, "connex_requests_running").value_or(0) >= 1;
      },
      kMidGenerationTimeoutMs, "streams mid-generation before killing " + lid));
  const double failovers_before = Failovers();
  const std::optional<double> resumes_before = ProxyMetric("connex_proxy_resumes_total");
  const std::optional<double> retries_before = ProxyMetric("connex_proxy_retries_total");
  const int pid = cluster_->pid(stage, replica);
  const int64_t t_kill = MonotonicNowNs();
  kill_ns_.push_back(t_kill);
  CONNEX_RETURN_IF_ERROR(cluster_->Kill(stage, replica));
  std::vector<std::shared_ptr<Outcome>> in_flight;
  for (const auto& out : load_.Outcomes()) {
    LiveStream::View v = out->live.Get();
    if (v.RunningAt(t_kill) && v.tokens > 0) in_flight.push_back(out);
  }
  Event(t_kill,
        StrCat("SIGKILL ", lid, " (pid ", pid, "), ", in_flight.size(), " streams in flight"));
  CONNEX_RETURN_IF_ERROR(WaitFor(
      [&] {
        for (const auto& out : in_flight) {
          if (!out->live.FirstTokenAfter(t_kill) && !out->live.Get().ended) return false;
        }
        return true;
      },
      kResumeTimeoutMs, "the streams in flight at the kill of " + lid + " to go on"));
  std::vector<double> next_token_ms;
  for (const auto& out : in_flight) {
    if (std::optional<int64_t> at = out->live.FirstTokenAfter(t_kill)) {
      next_token_ms.push_back(Ms(*at - t_kill));
    }
  }
  std::sort(next_token_ms.begin(), next_token_ms.end());
  Event(MonotonicNowNs(),
        StrCat("every stream in flight went on; kill -> next token: worst ",
               next_token_ms.empty() ? std::string("-") : MsText(next_token_ms.back())));
  // What shows the kill was felt: the proxy's resumes (a stage 0), the owners' failovers (a
  // middle stage).
  json noticed = nullptr;
  if (stage == 0) {
    // A request the killed replica had not started streaming is sent again (a retry), one it
    // had, resumed: either shows the proxy felt the kill.
    if (resumes_before && retries_before) {
      auto sent_again = [&]() -> std::optional<double> {
        std::optional<double> resumes = ProxyMetric("connex_proxy_resumes_total");
        std::optional<double> retries = ProxyMetric("connex_proxy_retries_total");
        if (!resumes || !retries) return std::nullopt;
        return *resumes + *retries;
      };
      if (WaitForIncrease(sent_again, *resumes_before + *retries_before)) {
        noticed = StrCat("connex_proxy_resumes_total ", Fixed(*resumes_before, 0), " -> ",
                         Fixed(ProxyMetric("connex_proxy_resumes_total").value_or(0), 0),
                         ", connex_proxy_retries_total ", Fixed(*retries_before, 0), " -> ",
                         Fixed(ProxyMetric("connex_proxy_retries_total").value_or(0), 0));
      }
    }
  } else if (std::optional<double> after = WaitForIncrease(
                 [&] { return std::optional<double>(Failovers()); }, failovers_before)) {
    noticed =
        StrCat("connex_failovers_total ", Fixed(failovers_before, 0), " -> ", Fixed(*after, 0));
  }
  const int64_t t_restart = MonotonicNowNs();
  Event(t_restart, StrCat("restarting ", lid, " with the same flags"));
  CONNEX_RETURN_IF_ERROR(cluster_->Restart(stage, replica));
  if (stage == 0) CONNEX_RETURN_IF_ERROR(cluster_->WaitHealthy(replica, 30'000));
  const double restart_s = static_cast<double>(MonotonicNowNs() - t_restart) / 1e9;
  json retries = nullptr;
  if (stage == 0 && retries_before) {
    if (std::optional<double> now = ProxyMetric("connex_proxy_retries_total")) {
      retries =
          StrCat("connex_proxy_retries_total ", Fixed(*retries_before, 0), " -> ", Fixed(*now, 0));
    }
  }
  const uint64_t epoch = cluster_->started_epoch(stage, replica);
  Event(MonotonicNowNs(), StrCat(lid, " ready again, epoch=", epoch, " (", Fixed(restart_s, 1),
                                 " s after the restart)"));
  return json{{"lid", lid},
              {"stage", stage},
              {"replica", replica},
              {"what", stage == 0             ? "a stage 0"
                       : stage + 1 == kStages ? "the last stage"
                                              : "a middle stage"},
              {"at_s", T(t_kill)},
              {"in_flight", in_flight.size()},
              {"next_token_ms", next_token_ms},
              {"noticed", noticed},
              {"restart_s", restart_s},
              {"epoch", epoch},
              {"retries", retries}};
}

void Demo::StartProgress() {
  progress_on_ = true;
  progress_ = std::thread([this] {
    size_t last_tokens = 0;
    while (progress_on_.load()) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (!progress_on_.load()) break;
      size_t running = 0, done = 0, failed = 0, tokens = 0;
      for (const auto& out : load_.Outcomes()) {
        LiveStream::View v = out->live.Get();
        tokens += static_cast<size_t>(v.tokens);
        if (!v.ended) {
          running += v.started;
        } else if (out->result.ok()) {
          ++done;
        } else {
          ++failed;
        }
      }
      char line[160];
      std::snprintf(line, sizeof(line),
                    " %5.1f s  streaming %zu  done %3zu  failed %zu  tokens %5zu  (%zu tok/s)",
                    T(MonotonicNowNs()), running, done, failed, tokens, tokens - last_tokens);
      Progress(o_, line);
      last_tokens = tokens;
    }
  });
}

void Demo::StopProgress() {
  progress_on_ = false;
  if (progress_.joinable()) progress_.join();
}

absl::StatusOr<json> Demo::Run() {
  json record = {{"campaign", "demo"}, {"machine", Machine()}};
  record["options"] = CommonJson(o_);
  record["options"].erase("seed");
  record["options"]["max_tokens"] = json::array({128, 192, 256});
  record["options"].update({{"clients", d_.clients}, {"proxy", d_.proxy}, {"phase_s", d_.phase_s}});
  if (d_.clients < 1 || d_.phase_s <= 0) {
    return absl::InvalidArgumentError("demo: --clients and --phase must be > 0");
  }
  Progress(o_, StrCat("connex demo: ", kReplicas, " replicas x ", kStages, " stages of '",
                      o_.model_name, "', ",
                      d_.proxy ? "connex-proxy"
                               : "NO proxy (the clients use the stage-0 replicas directly)",
                      ", ", d_.clients, " streaming clients, 127.0.0.1 only"));
  const int64_t t_start = MonotonicNowNs();
  // The deployment as its users run it: the binaries' default lease, heartbeat, step and probe
  // timeouts (connex-chaos's other campaigns shorten them).
  ClusterOptions co;
  co.bin_dir = o_.bin_dir;
  co.work_dir = o_.work_dir;
  co.model_path = o_.model_path;
  co.model_name = o_.model_name;
  co.replicas = kReplicas;
  co.stages = kStages;
  co.backend = o_.backend;
  co.kv_standby = o_.kv_standby;
  co.proxy = d_.proxy;
  co.lease_ttl_ms = 3000;
  co.heartbeat_ms = 1000;
  co.step_timeout_ms = 5000;
  co.probe_timeout_ms = 500;
  co.proxy_idle_timeout_ms = 30'000;
  CONNEX_ASSIGN_OR_RETURN(cluster_, Cluster::Start(std::move(co)));
  for (uint32_t r = 0; r < kReplicas; ++r) {
    std::string lids;
    for (uint32_t s = 0; s < kStages; ++s) {
      lids += (s ? ", " : "") + cluster_->lid(s, r).ToString();
    }
    Progress(o_, StrCat("- replica ", r, ": ", lids,
                        " ready; its stage 0 serves http=", cluster_->api(r).ToString()));
  }
  if (d_.proxy) Progress(o_, "- connex-proxy listening http=" + cluster_->proxy()->ToString());
  Progress(o_,
           StrCat("- ready in ", Fixed(static_cast<double>(MonotonicNowNs() - t_start) / 1e9, 1),
                  " s; streaming /v1/completions (greedy and seeded sampling)"));

  load_.set_model(o_.model_name);
  load_start_ns_ = MonotonicNowNs();
  load_.StartClients(
      d_.clients, DemoSpec,
      [this](int client) -> std::pair<HostPort, std::string> {
        if (d_.proxy) return {*cluster_->proxy(), "proxy"};
        const uint32_t r = static_cast<uint32_t>(client) % kReplicas;
        return {cluster_->api(r), StrCat("replica ", r)};
      },
      kPauseMs, o_.request_timeout_ms);
  StartProgress();
  json kills = json::array();
  CONNEX_ASSIGN_OR_RETURN(json middle, KillMidGeneration(2, 0));
  kills.push_back(middle);
  if (d_.proxy) {
    CONNEX_ASSIGN_OR_RETURN(json first, KillMidGeneration(0, 1));
    kills.push_back(first);
  }
  CONNEX_RETURN_IF_ERROR(Pace(d_.phase_s));  // the restarted stages take traffic
  // A new process: everything it counts came after its restart. A large model's requests may
  // outlast the phase (a 128k-vocabulary checkpoint: ~10 s each here), so the load goes on until
  // the restarted stage 0 completed one, for at most kRestartedTrafficS more.
  std::optional<double> restarted;
  if (d_.proxy) {
    const int64_t until = MonotonicNowNs() + static_cast<int64_t>(kRestartedTrafficS * 1e9);
    while (true) {
      restarted = Stage0Metric(1, "connex_request_success_total").value_or(0);
      if (*restarted >= 1 || MonotonicNowNs() >= until) break;
      CONNEX_RETURN_IF_ERROR(Pace(0.5));
    }
  }
  load_.StopClients();
  std::vector<std::shared_ptr<Outcome>> outcomes = load_.Wait();
  const double load_s = static_cast<double>(MonotonicNowNs() - load_start_ns_) / 1e9;
  StopProgress();
  const std::vector<std::string> shutdown = cluster_->StopAll(kStopGraceMs);
  const std::string model_path = cluster_->model_path();
  cluster_.reset();
  Progress(o_, StrCat("- load stopped after ", Fixed(load_s, 1),
                      " s, every process stopped (SIGTERM); connex-generate on every prompt:"));
  const int64_t t_ref = MonotonicNowNs();
  CONNEX_RETURN_IF_ERROR(Check(o_, model_path, outcomes));
  const double reference_s = static_cast<double>(MonotonicNowNs() - t_ref) / 1e9;

  // The figures.
  json totals = Totals(outcomes);
  int64_t greedy = 0, tokens = 0, good_tokens = 0;
  std::vector<double> gaps;  // between two tokens of a stream, outside the kills
  for (const auto& out : outcomes) {
    const StreamResult& r = out->result;
    tokens += static_cast<int64_t>(r.tokens.size());
    if (!r.ok()) continue;
    greedy += out->spec.temperature == 0;
    if (out->correct) good_tokens += static_cast<int64_t>(r.tokens.size());
    for (size_t i = 1; i < r.token_ns.size(); ++i) {
      const int64_t a = r.token_ns[i - 1], b = r.token_ns[i];
      if (b <= a) continue;  // one chunk
      if (std::any_of(kill_ns_.begin(), kill_ns_.end(),
                      [&](int64_t k) { return a <= k && k <= b; })) {
        continue;
      }
      gaps.push_back(Ms(b - a));
    }
  }
  totals["greedy"] = greedy;
  totals["sampled"] = totals["completed"].get<int64_t>() - greedy;
  totals["tokens_streamed"] = tokens;
  totals["load_s"] = load_s;
  totals["median_token_gap_ms"] = Median(gaps);
  totals["goodput_tokens_per_s"] = static_cast<double>(good_tokens) / load_s;
  totals["reference_s"] = reference_s;

  // The checks.
  std::vector<std::string> problems;
  for (const json& k : kills) {
    const std::string lid = k["lid"].get<std::string>();
    if (k["in_flight"].get<int64_t>() == 0) {
      problems.push_back("the kill of " + lid + " found no stream in flight");
    }
    if (k["noticed"].is_null()) {
      problems.push_back("the kill of " + lid + " was not noticed (no failover, no resume)");
    }
  }
  if (restarted && *restarted < 1) {
    problems.push_back(StrCat("the restarted ", Lid{o_.model_name, 0, 0, 1}.ToString(),
                              " completed no request in the ",
                              Fixed(d_.phase_s + kRestartedTrafficS, 0), " s after its restart"));
  }
  std::vector<std::shared_ptr<Outcome>> mismatched, failed;
  for (const auto& out : outcomes) {
    if (!out->result.ok()) {
      failed.push_back(out);
    } else if (!out->correct) {
      mismatched.push_back(out);
    }
  }
  for (size_t i = 0; i < mismatched.size() && i < 10; ++i) {
    const Outcome& out = *mismatched[i];
    problems.push_back(StrCat("request #", out.index, " (", Sampling(out.spec), ", max_tokens ",
                              out.spec.max_tokens, ", prompt ", ShellQuoted(out.spec.prompt),
                              "): ", Differences(out)));
  }
  if (mismatched.size() > 10) {
    problems.push_back(StrCat("... and ", mismatched.size() - 10, " more mismatches"));
  }
  if (!mismatched.empty()) {
    const RequestSpec& s = mismatched.front()->spec;
    problems.push_back(StrCat(
        "to reproduce request #", mismatched.front()->index,
        " (the work directory is kept): ", o_.bin_dir, "/connex-generate --model ", model_path,
        " --prompt ", ShellQuoted(s.prompt), " --max-tokens ", s.max_tokens,
        s.temperature > 0 ? StrCat(" --temperature ", Fixed(s.temperature, 1), " --seed ", s.seed)
                          : std::string(),
        " --stages ", kStages,
        " --generation-config none --json; and the same POST /v1/completions ",
        s.Body(o_.model_name), " to a stage 0 or the proxy"));
  }
  json failures = json::array();
  for (size_t i = 0; i < failed.size(); ++i) {
    failures.push_back(Failure(*failed[i]));
    if (i < 10) {
      problems.push_back(StrCat("request #", failed[i]->index, " (", Sampling(failed[i]->spec),
                                ", prompt ", ShellQuoted(failed[i]->spec.prompt),
                                ") failed: ", failed[i]->result.error));
    }
  }
  if (failed.size() > 10) {
    problems.push_back(StrCat("... and ", failed.size() - 10, " more failed requests"));
  }
  problems.insert(problems.end(), shutdown.begin(), shutdown.end());
  if (totals["completed"].get<int64_t>() == 0) problems.push_back("no request completed");

  record["deployment"] = {{"replicas", kReplicas},       {"stages", kStages},
                          {"model_name", o_.model_name}, {"backend", o_.backend},
                          {"kv_standby", o_.kv_standby}, {"proxy", d_.proxy}};
  record["totals"] = totals;
  record["kills"] = kills;
  record["restarted_stage0_completed"] = restarted ? json(*restarted) : json(nullptr);
  record["shutdown"] = shutdown;
  record["failures"] = failures;
  record["problems"] = problems;
  record["ok"] = problems.empty();
  return record;
}

}  // namespace

absl::StatusOr<json> RunDemo(const DemoOptions& options) {
  Demo demo(options);
  return demo.Run();
}

std::string DemoReport(const json& r) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  const json& d = r["deployment"];
  const json& t = r["totals"];
  const int64_t done = t["completed"].get<int64_t>();
  line("");
  line("=== connex demo report ===");
  line(StrCat("deployment   ", d["replicas"].get<int>(), " replicas x ", d["stages"].get<int>(),
              " stages of '", d["model_name"].get<std::string>(), "', backend ",
              d["backend"].get<std::string>(), ", KV standby ",
              d.value("kv_standby", false) ? "on" : "off (a killed stage's requests re-prefill)",
              ", ",
              d["proxy"].get<bool>() ? "through connex-proxy" : "stage 0 directly (--no-proxy)"));
  line("model        " + r["options"]["model"].get<std::string>());
  line(StrCat("requests     ", done, " done (", t["greedy"].get<int64_t>(), " greedy, ",
              t["sampled"].get<int64_t>(), " seeded T=0.8), ", t["failed"].get<int64_t>(),
              " failed; ", r["options"]["clients"].get<int>(), " streaming clients"));
  line(StrCat("tokens       ", t["tokens_streamed"].get<int64_t>(), " streamed in ",
              Fixed(t["load_s"].get<double>(), 1), " s; a stream's median gap between two tokens ",
              MsText(t["median_token_gap_ms"].get<double>())));
  line(StrCat("goodput      ", Fixed(t["goodput_tokens_per_s"].get<double>(), 1),
              " tokens/s (of completions identical to connex-generate)"));
  for (const json& k : r["kills"]) {
    line(StrCat("kill         ", k["lid"].get<std::string>(), " (", k["what"].get<std::string>(),
                "): SIGKILL at ", Fixed(k["at_s"].get<double>(), 1), " s, ",
                k["in_flight"].get<int64_t>(), " streams in flight"));
    std::vector<double> g = k["next_token_ms"].get<std::vector<double>>();
    if (!g.empty()) {
      line(StrCat("             kill -> next token ", MsText(g.back()),
                  " (the last of them to get one; first ", MsText(g.front()), ", median ",
                  MsText(Median(g)), ")"));
    }
    line("             noticed: " +
         (k["noticed"].is_null() ? std::string("NOT NOTICED") : k["noticed"].get<std::string>()));
    line(StrCat("             restarted under the same LID: ready in ",
                Fixed(k["restart_s"].get<double>(), 1), " s (epoch ", k["epoch"].get<uint64_t>(),
                ")"));
    if (!k["retries"].is_null()) {
      line("             " + k["retries"].get<std::string>() +
           " from the kill to the restart (resumes included)");
    }
  }
  if (!r["restarted_stage0_completed"].is_null()) {
    line(StrCat("             then completed ",
                Fixed(r["restarted_stage0_completed"].get<double>(), 0), " requests"));
  }
  line(StrCat("exactness    ", t["correct"].get<int64_t>(), "/", done,
              " completions identical to connex-generate (token ids and text), with"));
  line(StrCat("             the right finish_reason, usage and one response id (",
              Fixed(t["reference_s"].get<double>(), 1), " s to compute)"));
  const size_t shutdown = r["shutdown"].size();
  line("shutdown     " + (shutdown == 0 ? std::string("every process exited 0 on SIGTERM")
                                        : StrCat(shutdown, " problems")));
  if (!r.value("ok", false)) {
    line("result       FAILED");
    for (const json& p : r["problems"]) line("  - " + p.get<std::string>());
  } else {
    line(
        "result       PASSED: every request completed, equal to connex-generate; every kill "
        "ridden out");
  }
  return out;
}

}  // namespace connex::chaos
