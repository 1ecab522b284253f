// connex-chaos pd: prefill-decode disaggregation under open-loop load while prefill and decode
// instances are killed (docs/design/pd.md), and, in the same run, the same load on a colocated
// pipeline of the same model for comparison. Every completion is checked against
// connex-generate; the record has goodput, TTFT and inter-token latency, fault to next token,
// and the KV handoffs' bytes, time and throughput.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "connex/base/json_text.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/load.h"

namespace connex::chaos {
namespace {

using json = nlohmann::json;

constexpr uint32_t kPrefillGroup = 1;
constexpr uint32_t kDecodeGroup = 2;

// Counters of the deployment that are summed over its processes, read from each victim before
// it dies (its counters die with it) and from the survivors at the end.
const char* const kSummed[] = {"connex_stage_pd_handoff_bytes_total",
                               "connex_stage_pd_handoff_results_total",
                               "connex_stage_pd_handoff_wait_seconds_total",
                               "connex_stage_kv_mirror_read_bytes_total",
                               "connex_stage_kv_mirror_read_seconds_total",
                               "connex_stage_kv_takeovers_total",
                               "connex_stage_kv_takeovers_lagged_total",
                               "connex_stage_pd_handoff_waits_expired_total",
                               "connex_stage_pd_retention_expired_total",
                               "connex_stage_failovers_total",
                               "connex_stage_reprefills_total",
                               "connex_stage_pd_handoffs_total",
                               "connex_stage_pd_retained_resumes_total"};

void AddMetrics(Cluster& c, uint32_t group, uint32_t replica, std::map<std::string, double>& sum) {
  absl::StatusOr<std::map<std::string, double>> m = c.Metrics(group, replica);
  if (!m.ok()) return;
  for (const char* name : kSummed) {
    if (auto it = m->find(name); it != m->end()) sum[name] += it->second;
  }
}

struct Fault {
  uint32_t group = 0;
  uint32_t replica = 0;
  int64_t at_ns = 0;
};

struct RunResult {
  std::vector<std::shared_ptr<Outcome>> outcomes;
  std::vector<Fault> faults;
  std::map<std::string, double> summed;  // kSummed over every process, killed ones included
};

// Poisson arrivals at `qps` for `duration_s` to `target`; every `kill_every_s` a victim from
// `victims` (group, replica) in turn is SIGKILLed and restarted half a period later.
absl::StatusOr<RunResult> RunLoad(const PdOptions& pd, Cluster& c, const HostPort& target,
                                  const std::vector<std::pair<uint32_t, uint32_t>>& victims,
                                  const std::string& label) {
  const CommonOptions& o = pd.common;
  RunResult out;
  Load load;
  load.set_model(c.options().model_name);
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(pd.qps);
  const int64_t t0 = MonotonicNowNs();
  const int64_t end = t0 + static_cast<int64_t>(pd.duration_s * 1e9);
  std::thread dispatcher([&] {
    int64_t next = t0;
    for (uint64_t index = 0;; ++index) {
      next += static_cast<int64_t>(gap(rng) * 1e9);
      if (next >= end) break;
      while (MonotonicNowNs() < next) {
        std::this_thread::sleep_for(std::chrono::microseconds(
            std::clamp<int64_t>((next - MonotonicNowNs()) / 1000, 1, 5000)));
      }
      load.Issue(index, SpecFor(index, o.max_tokens), target, label, -1, o.request_timeout_ms);
    }
  });
  absl::Status failure;
  size_t next_victim = 0;
  for (double at = pd.kill_every_s; pd.kill_every_s > 0 && !victims.empty() &&
                                    at < pd.duration_s - pd.kill_every_s / 2 && failure.ok();
       at += pd.kill_every_s) {
    const int64_t t_fault = t0 + static_cast<int64_t>(at * 1e9);
    while (MonotonicNowNs() < t_fault) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto [group, replica] = victims[next_victim++ % victims.size()];
    AddMetrics(c, group, replica, out.summed);
    Fault f{group, replica, MonotonicNowNs()};
    failure = c.Kill(group, replica);
    out.faults.push_back(f);
    Progress(o, StrCat(label, ": ", static_cast<int64_t>(Ms(f.at_ns - t0) / 1000), " s: killed ",
                       c.lid(group, replica).ToString(), " (", load.issued(), " issued, ",
                       load.done(), " done)"));
    const int64_t back_at = f.at_ns + static_cast<int64_t>(pd.kill_every_s / 2 * 1e9);
    while (MonotonicNowNs() < back_at) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (failure.ok()) failure = c.Restart(group, replica);
  }
  dispatcher.join();
  out.outcomes = load.Wait();
  if (!failure.ok()) return failure;
  const ClusterOptions& co = c.options();
  for (uint32_t g = 0; g < co.groups(); ++g) {
    for (uint32_t r = 0; r < co.members(g); ++r) AddMetrics(c, g, r, out.summed);
  }
  return out;
}

// The next token after each fault of every stream under way at it (ms), by the victim's group.
std::map<uint32_t, std::vector<double>> FaultToNextToken(const RunResult& r) {
  std::map<uint32_t, std::vector<double>> gaps;
  for (const Fault& f : r.faults) {
    for (const auto& o : r.outcomes) {
      const LiveStream::View v = o->live.Get();
      if (!v.RunningAt(f.at_ns) || v.tokens == 0) continue;
      std::optional<int64_t> next = o->live.FirstTokenAfter(f.at_ns);
      if (next) gaps[f.group].push_back(Ms(*next - f.at_ns));
    }
  }
  return gaps;
}

double Get(const std::map<std::string, double>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? 0 : it->second;
}

// `pd`: the record of the disaggregated deployment (its groups are pools).
json Side(const RunResult& r, bool pd) {
  json s;
  json totals = Totals(r.outcomes);
  const double issued = static_cast<double>(r.outcomes.size());
  totals["goodput"] = issued == 0 ? 0.0 : totals["correct"].get<double>() / issued;
  s["totals"] = totals;
  s["latency"] = Latencies(r.outcomes);
  s["faults"] = r.faults.size();
  json gaps = json::object();
  for (const auto& [group, v] : FaultToNextToken(r)) {
    const char* name = !pd                      ? "stage 1"
                       : group == kPrefillGroup ? "prefill"
                       : group == kDecodeGroup  ? "decode"
                                                : "frontend";
    gaps[name] = Dist(v);
  }
  s["fault_to_next_token_ms"] = gaps;
  json lost = json::array();
  for (const auto& out : r.outcomes) {
    if (out->correct) continue;
    json l = Failure(*out);
    if (out->result.ok()) l["error"] = "differs from connex-generate: " + Differences(*out);
    lost.push_back(l);
  }
  s["lost"] = lost;
  s["failovers"] = Get(r.summed, "connex_stage_failovers_total");
  s["reprefills"] = Get(r.summed, "connex_stage_reprefills_total");
  return s;
}

}  // namespace

absl::StatusOr<json> RunPd(const PdOptions& pd) {
  CommonOptions o = pd.common;
  o.stages = 2;
  json record = {{"campaign", "pd"}, {"machine", Machine()}};
  record["options"] = CommonJson(o);
  record["options"].update({{"frontends", o.replicas},
                            {"prefill", pd.prefill},
                            {"decode", pd.decode},
                            {"qps", pd.qps},
                            {"duration_s", pd.duration_s},
                            {"kill_every_s", pd.kill_every_s},
                            {"kill", pd.kill},
                            {"colocated", pd.colocated}});
  if (pd.prefill == 0 || pd.decode == 0 || pd.qps <= 0 || pd.duration_s <= 0) {
    return absl::InvalidArgumentError(
        "pd: --prefill and --decode must be at least 1, --qps and --duration > 0");
  }
  if (pd.kill != "prefill" && pd.kill != "decode" && pd.kill != "both" && pd.kill != "none") {
    return absl::InvalidArgumentError(
        StrCat("pd --kill '", pd.kill, "': prefill, decode, both or none"));
  }
  // The disaggregated deployment.
  ClusterOptions co;
  co.bin_dir = o.bin_dir;
  co.work_dir = o.work_dir + "/pd";
  std::filesystem::create_directories(co.work_dir);
  co.model_path = o.model_path;
  co.model_name = o.model_name;
  co.replicas = o.replicas;
  co.stages = 2;
  co.pd_prefill = pd.prefill;
  co.pd_decode = pd.decode;
  co.backend = o.backend;
  co.proxy = o.replicas > 1;
  co.kv_standby = o.kv_standby;
  Progress(o, StrCat("pd: starting ", o.replicas, " frontend(s), ", pd.prefill, " prefill and ",
                     pd.decode, " decode instances", o.kv_standby ? " (decode KV standby)" : ""));
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> c, Cluster::Start(co));
  std::vector<std::pair<uint32_t, uint32_t>> victims;
  for (uint32_t i = 0; i < std::max(pd.prefill, pd.decode); ++i) {
    if ((pd.kill == "decode" || pd.kill == "both") && i < pd.decode)
      victims.emplace_back(kDecodeGroup, i);
    if ((pd.kill == "prefill" || pd.kill == "both") && i < pd.prefill)
      victims.emplace_back(kPrefillGroup, i);
  }
  const HostPort target = c->proxy() ? *c->proxy() : c->api(0);
  CONNEX_ASSIGN_OR_RETURN(RunResult disaggregated, RunLoad(pd, *c, target, victims, "pd"));
  const std::string model_path = c->model_path();
  c.reset();
  o.model_path = model_path;
  CONNEX_RETURN_IF_ERROR(Check(o, model_path, disaggregated.outcomes));

  // The same load on a colocated pipeline: as many chains of 2 stages as the PD deployment has
  // decode instances, behind the proxy; its stage 1s are killed at the same times.
  std::optional<RunResult> colocated;
  if (pd.colocated) {
    ClusterOptions cc = co;
    cc.work_dir = o.work_dir + "/colocated";
    std::filesystem::create_directories(cc.work_dir);
    cc.model_path = model_path;
    cc.pd_prefill = cc.pd_decode = 0;
    cc.replicas = pd.decode;
    cc.proxy = true;
    Progress(o, StrCat("colocated: starting ", cc.replicas, " chains of 2 stages and the proxy"));
    CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cl, Cluster::Start(cc));
    std::vector<std::pair<uint32_t, uint32_t>> stage1;
    if (pd.kill != "none") {
      for (uint32_t r = 0; r < cc.replicas; ++r) stage1.emplace_back(1, r);
    }
    CONNEX_ASSIGN_OR_RETURN(RunResult run, RunLoad(pd, *cl, *cl->proxy(), stage1, "colocated"));
    // The proxy's replicas are stage 0s; its metrics are the frontend figures here.
    cl.reset();
    CONNEX_RETURN_IF_ERROR(Check(o, model_path, run.outcomes));
    colocated = std::move(run);
  }

  json pdj = Side(disaggregated, /*pd=*/true);
  const std::map<std::string, double>& s = disaggregated.summed;
  const double results = Get(s, "connex_stage_pd_handoff_results_total");
  const double handoff_bytes = Get(s, "connex_stage_pd_handoff_bytes_total");
  const double read_bytes = Get(s, "connex_stage_kv_mirror_read_bytes_total");
  const double read_s = Get(s, "connex_stage_kv_mirror_read_seconds_total");
  pdj["kv"] = {
      {"handoffs", Get(s, "connex_stage_pd_handoffs_total")},
      {"retained_resumes", Get(s, "connex_stage_pd_retained_resumes_total")},
      {"handoff_bytes", handoff_bytes},
      {"bytes_per_request", results > 0 ? handoff_bytes / results : 0.0},
      // The part of a transfer not overlapped with the prefill: a RESULT held for its handoff.
      {"wait_ms_per_request",
       results > 0 ? 1000 * Get(s, "connex_stage_pd_handoff_wait_seconds_total") / results : 0.0},
      {"waits_expired", Get(s, "connex_stage_pd_handoff_waits_expired_total")},
      {"read_bytes", read_bytes},
      {"read_seconds", read_s},
      // Mirrors pulled by the decode instances (handoffs and the decode standbys' mirrors).
      {"read_throughput_gbps", read_s > 0 ? read_bytes / read_s / 1e9 : 0.0},
      {"takeovers", Get(s, "connex_stage_kv_takeovers_total")},
      {"takeovers_lagged", Get(s, "connex_stage_kv_takeovers_lagged_total")},
      {"retention_expired", Get(s, "connex_stage_pd_retention_expired_total")}};
  record["pd"] = pdj;
  if (colocated) record["colocated"] = Side(*colocated, /*pd=*/false);

  std::vector<std::string> problems;
  auto check = [&problems](const json& side, const std::string& name) {
    const json& t = side["totals"];
    if (t["mismatched_tokens"].get<int64_t>() > 0) {
      problems.push_back(
          StrCat(name, ": ", t["mismatched_tokens"].get<int64_t>(), " mismatched tokens"));
    }
    if (t["correct"].get<int64_t>() != t["issued"].get<int64_t>()) {
      problems.push_back(StrCat(name, ": ", side["lost"].size(), " of ", t["issued"].get<int64_t>(),
                                " requests lost or wrong"));
    }
  };
  check(record["pd"], "pd");
  if (colocated) check(record["colocated"], "colocated");
  if (pdj["kv"]["handoffs"].get<double>() <= 0)
    problems.push_back("pd: no request was handed over");
  record["problems"] = problems;
  record["ok"] = problems.empty();
  return record;
}

std::string PdReport(const json& r) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  const auto f1 = [](double v) { return F1(v); };
  const json& op = r["options"];
  line(StrCat("=== connex pd report (", r["machine"].value("date", ""), ", ",
              r["machine"].value("cores", 0), " cores) ==="));
  line(StrCat("load: ", f1(op["qps"]), " req/s for ", f1(op["duration_s"]), " s, ",
              op["max_tokens"].get<int>(), " tokens each; a kill every ", f1(op["kill_every_s"]),
              " s (", op["kill"].get<std::string>(), ")"));
  auto side = [&](const std::string& key, const std::string& what) {
    if (!r.contains(key)) return;
    const json& s = r[key];
    const json& t = s["totals"];
    const json& l = s["latency"];
    line(StrCat(what, ":"));
    line(StrCat("  requests ", t["issued"].get<int64_t>(), ", exact ", t["correct"].get<int64_t>(),
                ", mismatched tokens ", t["mismatched_tokens"].get<int64_t>(), ", goodput ",
                f1(100 * t["goodput"].get<double>()), " % over ", s["faults"].get<int64_t>(),
                " kills"));
    line(StrCat("  TTFT p50 ", f1(l["ttft_ms"]["p50"]), " ms, p99 ", f1(l["ttft_ms"]["p99"]),
                " ms; inter-token p50 ", f1(l["tpot_ms"]["p50"]), " ms, p99 ",
                f1(l["tpot_ms"]["p99"]), " ms"));
    for (const auto& [group, d] : s["fault_to_next_token_ms"].items()) {
      line(StrCat("  ", group, " kill -> next token (n=", d["n"].get<int64_t>(), "): p50 ",
                  f1(d["p50"]), " ms, p99 ", f1(d["p99"]), " ms"));
    }
    if (s.contains("kv")) {
      const json& kv = s["kv"];
      line(StrCat("  KV handed over: ", kv["handoffs"].get<double>(), " requests, ",
                  f1(kv["bytes_per_request"].get<double>() / 1024), " KiB each; held for it ",
                  f1(kv["wait_ms_per_request"]), " ms per request; reads ",
                  f1(kv["read_throughput_gbps"]), " GB/s; takeovers ",
                  kv["takeovers"].get<double>(), ", resumed from a retained copy ",
                  kv["retained_resumes"].get<double>()));
    }
    line(StrCat("  failovers ", s["failovers"].get<double>(), ", re-prefills ",
                s["reprefills"].get<double>()));
    for (const auto& lost : s["lost"]) line("  lost: " + DumpJson(lost));
  };
  side("pd",
       StrCat("disaggregated (", op["frontends"].get<int>(), " frontend, ",
              op["prefill"].get<int>(), " prefill + ", op["decode"].get<int>(), " decode instances",
              op["kv_standby"].get<bool>() ? ", decode KV standby" : "", ")"));
  side("colocated", StrCat("colocated (", op["decode"].get<int>(), " chains of 2 stages)"));
  for (const auto& p : r["problems"]) line("PROBLEM: " + p.get<std::string>());
  line(r.value("ok", false) ? "PASS" : "FAIL");
  return out;
}

}  // namespace connex::chaos
