// StageNodeOptions (node.h): the CONNEX_PP_* settings and what cannot work.
#include "connex/base/config.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/pp/node.h"

namespace connex::pp {

absl::StatusOr<StageNodeOptions> StageNodeOptions::FromEnv(StageNodeOptions o) {
  CONNEX_ASSIGN_OR_RETURN(int64_t inflight, EnvInt("CONNEX_PP_INFLIGHT", o.inflight, 1, 1024));
  o.inflight = static_cast<int>(inflight);
  CONNEX_ASSIGN_OR_RETURN(o.step_timeout_ms,
                          EnvInt("CONNEX_PP_STEP_TIMEOUT_MS", o.step_timeout_ms, 1, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.probe_timeout_ms,
                          EnvInt("CONNEX_PP_PROBE_TIMEOUT_MS", o.probe_timeout_ms, 1, 600'000));
  CONNEX_ASSIGN_OR_RETURN(int64_t max, EnvInt("CONNEX_PP_REPREFILL_MAX", o.reprefill_max, 0, 1000));
  o.reprefill_max = static_cast<int>(max);
  CONNEX_ASSIGN_OR_RETURN(o.route_wait_ms,
                          EnvInt("CONNEX_PP_ROUTE_WAIT_MS", o.route_wait_ms, 1, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(int64_t slots, EnvInt("CONNEX_PP_RING_SLOTS", o.ring_slots, 1, 4096));
  o.ring_slots = static_cast<int>(slots);
  CONNEX_ASSIGN_OR_RETURN(o.slot_bytes,
                          EnvInt("CONNEX_PP_SLOT_BYTES", o.slot_bytes, 4096, int64_t{1} << 32));
  CONNEX_ASSIGN_OR_RETURN(int64_t batch, EnvInt("CONNEX_PP_MAX_BATCH", o.max_batch, 1, 4096));
  o.max_batch = static_cast<int>(batch);
  CONNEX_ASSIGN_OR_RETURN(o.request_timeout_ms, EnvInt("CONNEX_PP_REQUEST_TIMEOUT_MS",
                                                       o.request_timeout_ms, 0, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(int64_t attempts,
                          EnvInt("CONNEX_PP_ATTEMPT_MAX", o.attempt_max, 1, 100000));
  o.attempt_max = static_cast<int>(attempts);
  CONNEX_ASSIGN_OR_RETURN(o.replay_cache_bytes, EnvInt("CONNEX_PP_REPLAY_CACHE_BYTES",
                                                       o.replay_cache_bytes, 0, int64_t{1} << 40));
  CONNEX_ASSIGN_OR_RETURN(o.owner_grace_ms,
                          EnvInt("CONNEX_PP_OWNER_GRACE_MS", o.owner_grace_ms, 0, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(o.stall_confirm_ms,
                          EnvInt("CONNEX_PP_STALL_CONFIRM_MS", o.stall_confirm_ms, 0, 3'600'000));
  CONNEX_ASSIGN_OR_RETURN(o.kv_standby, EnvBool("CONNEX_PP_KV_STANDBY", o.kv_standby));
  CONNEX_ASSIGN_OR_RETURN(o.kv_standby_interval_ms, EnvInt("CONNEX_PP_KV_STANDBY_INTERVAL_MS",
                                                           o.kv_standby_interval_ms, 0, 60'000));
  CONNEX_ASSIGN_OR_RETURN(o.kv_standby_grace_ms, EnvInt("CONNEX_PP_KV_STANDBY_GRACE_MS",
                                                        o.kv_standby_grace_ms, 0, 86'400'000));
  if (std::optional<std::string> bytes = GetEnv("CONNEX_PP_KV_STANDBY_BYTES")) {
    absl::StatusOr<uint64_t> parsed = ParseSize(*bytes);
    if (!parsed.ok() || *parsed > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          StrCat("CONNEX_PP_KV_STANDBY_BYTES: '", *bytes, "' is not a size up to 1T (e.g. 256M)"));
    }
    o.kv_standby_bytes = static_cast<int64_t>(*parsed);
  }
  if (std::optional<std::string> role = GetEnv("CONNEX_PD_ROLE")) {
    CONNEX_ASSIGN_OR_RETURN(o.pd_role, ParsePdRole(*role, "CONNEX_PD_ROLE"));
  }
  CONNEX_ASSIGN_OR_RETURN(o.pd_retain_ms,
                          EnvInt("CONNEX_PD_RETAIN_MS", o.pd_retain_ms, 0, 86'400'000));
  CONNEX_ASSIGN_OR_RETURN(o.pd_handoff_wait_ms,
                          EnvInt("CONNEX_PD_HANDOFF_WAIT_MS", o.pd_handoff_wait_ms, 0, 600'000));
  if (std::optional<std::string> bytes = GetEnv("CONNEX_PD_RETAIN_BYTES")) {
    absl::StatusOr<uint64_t> parsed = ParseSize(*bytes);
    if (!parsed.ok() || *parsed > (uint64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          StrCat("CONNEX_PD_RETAIN_BYTES: '", *bytes, "' is not a size up to 1T (e.g. 1G)"));
    }
    o.pd_retain_bytes = static_cast<int64_t>(*parsed);
  }
  return o;
}

absl::Status StageNodeOptions::Validate() const {
  if (stages == 0) return absl::InvalidArgumentError("pp: stages must be at least 1, not 0");
  if (stage >= stages) {
    return absl::InvalidArgumentError(StrCat("pp: stage ", stage, " is outside a pipeline of ",
                                             stages, " stages (0..", stages - 1, ")"));
  }
  if (inflight < 1) return absl::InvalidArgumentError(StrCat("pp: inflight ", inflight));
  if (ring_slots < 1) return absl::InvalidArgumentError(StrCat("pp: ring_slots ", ring_slots));
  if (slot_bytes < 4096 || slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(
        StrCat("pp: slot_bytes ", slot_bytes, " (need a multiple of 64, at least 4096)"));
  }
  if (max_batch < 1) return absl::InvalidArgumentError(StrCat("pp: max_batch ", max_batch));
  if (attempt_max < 1) return absl::InvalidArgumentError(StrCat("pp: attempt_max ", attempt_max));
  if (kv_standby_bytes < 0) {
    return absl::InvalidArgumentError(StrCat("pp: kv_standby_bytes ", kv_standby_bytes));
  }
  if (pd_role != PdRole::kNone) {
    // A PD deployment is two stages: the frontends, then a pool of prefill and one of decode.
    const uint32_t want = pd_role == PdRole::kFrontend ? 0 : 1;
    if (stages != 2 || stage != want) {
      return absl::InvalidArgumentError(StrCat("pp: a ", PdRoleName(pd_role),
                                               " of a prefill-decode deployment is stage ", want,
                                               " of 2, not stage ", stage, " of ", stages));
    }
    if (pd_retain_bytes < 0 || pd_retain_ms < 0 || pd_handoff_wait_ms < 0) {
      return absl::InvalidArgumentError(
          "pp: pd_retain_bytes, pd_retain_ms and "
          "pd_handoff_wait_ms must not be negative");
    }
  }
  if (step_timeout_ms < 1 || probe_timeout_ms < 1 || route_wait_ms < 1 || request_timeout_ms < 0 ||
      stall_confirm_ms < 0) {
    return absl::InvalidArgumentError("pp: timeouts must be positive");
  }
  return absl::OkStatus();
}

}  // namespace connex::pp
