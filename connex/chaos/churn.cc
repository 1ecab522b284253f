// connex-chaos churn: open-loop load while whole replicas go (SIGKILL or a graceful leave) and
// come back.
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
    if (out->result.ok())
      l["error"] = "completed, but differs from connex-generate: " + Differences(*out);
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

}  // namespace connex::chaos
