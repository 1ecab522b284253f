// The campaigns of connex-chaos that measure without faults: steady (latency and throughput per
// rate and K), overload (past stage 0's admission) and proxy-cost (direct vs through the proxy).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/load.h"

namespace connex::chaos {

using json = nlohmann::json;

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
  AddDifferingProblem(totals, problems);
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
  AddDifferingProblem(totals, problems);
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

}  // namespace connex::chaos
