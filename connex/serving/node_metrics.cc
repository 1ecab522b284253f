#include "connex/serving/node_metrics.h"

#include <cstdint>
#include <string_view>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/serving/metrics.h"
#include "connex/serving/openai_response.h"
#include "fmt/format.h"

namespace connex::serving {
namespace {

void AppendFamily(std::string* out, std::string_view name, std::string_view type,
                  std::string_view help, uint64_t value) {
  *out += StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", value,
                 "\n");
}

}  // namespace

std::string RenderNodeStats(const pp::StageNodeStats& s) {
  std::string out;
  auto counter = [&out](std::string_view field, std::string_view help, uint64_t value) {
    AppendFamily(&out, StrCat("connex_stage_", field, "_total"), "counter", help, value);
  };
  auto gauge = [&out](std::string_view field, std::string_view help, uint64_t value) {
    AppendFamily(&out, StrCat("connex_stage_", field), "gauge", help, value);
  };
  // A counter of seconds, from microseconds.
  auto seconds = [&out](std::string_view field, std::string_view help, uint64_t us) {
    const std::string name = StrCat("connex_stage_", field, "_seconds_total");
    out += StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name, " ",
                  fmt::format("{:.6f}", static_cast<double>(us) / 1e6), "\n");
  };
  counter("steps_executed", "Engine steps run on this stage", s.steps_executed);
  counter("steps_replayed", "Re-sent attempts answered from the output cache", s.steps_replayed);
  counter("duplicates_dropped", "Duplicate steps dropped", s.duplicates_dropped);
  counter("fenced", "Signals refused for a wrong epoch", s.fenced);
  counter("missing_reported", "Steps answered MISSING (state not held)", s.missing_reported);
  counter("late_dropped", "Results of superseded attempts dropped (owner)", s.late_dropped);
  counter("resends", "Steps re-sent (owner)", s.resends);
  counter("failovers", "Requests moved to another replica (owner)", s.failovers);
  counter("reprefills", "Requests recomputed (owner)", s.reprefills);
  counter("aborted", "Requests aborted (owner)", s.aborted);
  counter("completed", "Requests finished (owner)", s.completed);
  counter("backpressured", "Sends that waited for a ring slot", s.backpressured);
  counter("forged_dropped", "Answers not from the hop or owner they claim, dropped",
          s.forged_dropped);
  counter("strangers_ignored",
          "PINGs and RELEASEs not from a member at its known address: not answered",
          s.strangers_ignored);
  counter("released", "Requests whose state this stage dropped", s.released);
  counter("chunked", "Steps that carried only part of a request's tokens (owner)", s.chunked);
  gauge("held_requests", "Requests whose state this stage holds (downstream)", s.held_requests);
  gauge("replay_bytes", "Bytes of outputs kept to answer re-sent attempts", s.replay_bytes);
  gauge("releases_pending", "RELEASEs not acknowledged yet (owner)", s.releases_pending);
  gauge("stalled_seconds",
        "Owner: time since a step of its requests last came back, while some are in flight",
        static_cast<double>(s.stalled_ms) / 1000.0);
  gauge("ring_in_use", "Ring slots awaiting acknowledgement", s.ring_in_use);
  gauge("requests_in_flight", "Requests submitted and not finished (owner)", s.requests_in_flight);
  gauge("steps_in_flight", "Steps not yet answered, and sends waiting for a slot (owner)",
        s.steps_in_flight);
  gauge("epoch", "The epoch this stage holds now (0: none)", s.epoch);
  counter("epoch_checks", "Epochs confirmed with the directory after a stall", s.epoch_checks);
  counter("steps_on_lease",
          "Steps run while the directory did not renew the lease, on the lease and the peers' "
          "answers",
          s.steps_on_lease);
  // KV standby (CONNEX_PP_KV_STANDBY).
  counter("lag_recomputes",
          "Requests a KV standby took over short of their step, recomputed from its position "
          "(owner)",
          s.lag_recomputes);
  counter("rewound", "Requests cut back to a step's start (a standby's lag recomputed)", s.rewound);
  gauge("kv_standby", "Whether this stage keeps a KV standby (1) or not (0)", s.kv_standby ? 1 : 0);
  counter("kv_mirrored_bytes", "State bytes this stage mirrored to its standby",
          s.kv_mirrored_bytes);
  counter("kv_mirror_updates", "MIRROR updates this stage sent to its standby",
          s.kv_mirror_updates);
  counter("kv_standby_changes", "Standbys this stage picked, replaced or lost",
          s.kv_standby_changes);
  gauge("kv_mirrors_held", "Requests of other stages mirrored here", s.kv_mirrors_held);
  gauge("kv_mirror_bytes_held", "Bytes of the mirrors held here",
        static_cast<uint64_t>(s.kv_mirror_bytes_held));
  counter("kv_mirrors_dropped_for_budget",
          "Mirrors dropped, oldest first, past CONNEX_PP_KV_STANDBY_BYTES",
          s.kv_mirrors_dropped_for_budget);
  counter("kv_takeovers", "Requests taken over from a mirror whose step ran at once",
          s.kv_takeovers);
  counter("kv_takeovers_lagged",
          "Requests taken over from a mirror short of their step (the lag recomputed)",
          s.kv_takeovers_lagged);
  counter("kv_mirror_read_bytes",
          "Mirror payload bytes this stage pulled (a standby, a decode "
          "instance's handoffs)",
          s.kv_mirror_bytes_received);
  seconds("kv_mirror_read", "Time those one-sided reads took", s.kv_mirror_read_us);
  // Prefill-decode disaggregation (CONNEX_PD_ROLE).
  counter("pd_handoffs", "Requests a prefill instance handed to a decode instance (frontend)",
          s.pd_handoffs);
  counter("pd_retained_resumes",
          "Requests a decode instance lost, resumed from their prefill instance's retained copy "
          "(frontend)",
          s.pd_retained_resumes);
  gauge("pd_prefilling", "Requests in their prefill now (frontend)", s.pd_prefilling);
  gauge("pd_decoding", "Requests in their decode now (frontend)", s.pd_decoding);
  counter("pd_handoff_bytes", "KV bytes this prefill instance handed to decode instances",
          s.pd_handoff_bytes);
  counter("pd_handoff_updates", "MIRROR updates this prefill instance sent to decode instances",
          s.pd_handoff_updates);
  counter("pd_handoff_results",
          "RESULTs this prefill instance held until their decode instance had the KV",
          s.pd_handoff_results);
  seconds("pd_handoff_wait",
          "Time those RESULTs were held (the KV transfer not overlapped with the prefill)",
          s.pd_handoff_wait_ms * 1000);
  counter("pd_handoff_waits_expired",
          "Held RESULTs sent after CONNEX_PD_HANDOFF_WAIT_MS without the KV confirmed",
          s.pd_handoff_waits_expired);
  gauge("pd_retained", "Requests whose KV this prefill instance retains", s.pd_retained);
  gauge("pd_retained_bytes", "Bytes of the KV this prefill instance retains",
        static_cast<uint64_t>(s.pd_retained_bytes));
  counter("pd_retention_expired",
          "Retained KV dropped past CONNEX_PD_RETAIN_MS or CONNEX_PD_RETAIN_BYTES",
          s.pd_retention_expired);
  {
    // The standby's lag when a step ran, in steps: a cumulative histogram.
    const std::string name = "connex_stage_kv_standby_lag_steps";
    out += StrCat("# HELP ", name,
                  " The KV standby's lag (positions not yet mirrored) when a step ran here\n",
                  "# TYPE ", name, " histogram\n");
    static constexpr const char* kLe[] = {"0", "1", "2", "4", "8", "16", "+Inf"};
    uint64_t cumulative = 0;
    for (size_t i = 0; i < s.kv_standby_lag.size(); ++i) {
      cumulative += s.kv_standby_lag[i];
      out += StrCat(name, "_bucket{le=\"", kLe[i], "\"} ", cumulative, "\n");
    }
    out += StrCat(name, "_count ", cumulative, "\n");
  }
  // Per epoch of the last few this process held: what ran under it, and when the last of it was
  // admitted (CLOCK_MONOTONIC, comparable across the processes of a host).
  auto per_epoch = [&out, &s](std::string_view name, std::string_view type, std::string_view help,
                              auto value) {
    out += StrCat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
    for (const pp::EpochSteps& e : s.epochs) {
      out += StrCat(name, "{epoch=\"", e.epoch, "\"} ", value(e), "\n");
    }
  };
  per_epoch("connex_stage_epoch_steps_executed_total", "counter",
            "Engine steps run on this stage under each of its last epochs",
            [](const pp::EpochSteps& e) { return e.steps_executed; });
  // Seconds (Prometheus' base unit; promtool refuses "_ns"), to the nanosecond.
  per_epoch("connex_stage_epoch_last_step_monotonic_seconds", "gauge",
            "CLOCK_MONOTONIC time (s) at which the last step run under each epoch was admitted "
            "(0: none)",
            [](const pp::EpochSteps& e) {
              return fmt::format("{}.{:09}", e.last_step_monotonic_ns / 1'000'000'000,
                                 e.last_step_monotonic_ns % 1'000'000'000);
            });
  return out;
}

absl::StatusOr<std::unique_ptr<StageMetricsServer>> StageMetricsServer::Listen(
    HttpServerOptions options) {
  std::unique_ptr<StageMetricsServer> s(new StageMetricsServer());
  StageMetricsServer* self = s.get();
  s->router_.AddInline("GET", "/metrics", [self](std::shared_ptr<HttpExchange> x) {
    StageProcess* stage = self->stage_.load();
    HttpResponse r;
    r.content_type = std::string(kPrometheusContentType);
    if (stage != nullptr) r.body = RenderNodeStats(stage->node().stats());
    x->Respond(std::move(r));
  });
  s->router_.AddInline("GET", "/health", [self](std::shared_ptr<HttpExchange> x) {
    StageProcess* stage = self->stage_.load();
    absl::Status ok =
        stage == nullptr ? absl::UnavailableError("the stage is starting") : stage->node().health();
    x->Respond(JsonResponse(ok.ok() ? 200 : 503, HealthResponse(ok.ok(), AsStd(ok.message()))));
  });
  CONNEX_ASSIGN_OR_RETURN(
      s->http_, StartHttpServer(options, s->router_.AsHandler(), s->router_.AsInlinePredicate()));
  return s;
}

StageMetricsServer::~StageMetricsServer() { Stop(); }

void StageMetricsServer::Stop() {
  if (http_) http_->Stop();
}

}  // namespace connex::serving
