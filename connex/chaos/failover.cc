// connex-chaos failover: one stage faulted (kill, stop, partition, drain) per run, with a batch
// of requests in flight.
#include <algorithm>
#include <map>
#include <optional>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/load.h"

namespace connex::chaos {
namespace {

using json = nlohmann::json;

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
      problems.push_back(StrCat("request ", out->index, ": ", Differences(*out)));
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

}  // namespace connex::chaos
