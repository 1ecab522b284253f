// Summary(): a campaign's record for people.
#include <cstdio>

#include "connex/base/json_text.h"
#include "connex/base/strings.h"
#include "connex/chaos/campaigns.h"
#include "connex/chaos/load.h"

namespace connex::chaos {

using json = nlohmann::json;

std::string Summary(const json& r) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  const auto f1 = [](double v) { return F1(v); };
  const std::string campaign = r.value("campaign", "?");
  if (campaign == "demo") return DemoReport(r);
  if (campaign == "pd") return PdReport(r);
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
    for (const auto& lost : r["lost"]) line("  lost: " + DumpJson(lost));
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
