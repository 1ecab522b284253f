// The campaigns of connex-chaos: each starts its own deployment (Cluster), drives a load of
// streamed completions through it, injects its faults, and compares every completed request's
// token ids with connex-generate's for the same prompt and sampling. Each returns its whole
// record as JSON (written by --json) and prints progress to stderr; Summary() renders a record
// for people. The checks that decide pass/fail are in the record's "ok" and "problems".
#ifndef CONNEX_CHAOS_CAMPAIGNS_H_
#define CONNEX_CHAOS_CAMPAIGNS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace connex::chaos {

struct CommonOptions {
  std::string bin_dir;     // the project's binaries
  std::string work_dir;    // logs, the model, references; kept when `keep`
  std::string model_path;  // empty: make the default model
  uint32_t replicas = 2;
  uint32_t stages = 4;
  std::string backend = "tcp";
  int max_tokens = 64;   // per request
  uint64_t seed = 1;     // the campaign's choices (prompts, sampling, victims)
  bool progress = true;  // progress lines on stderr
  int64_t request_timeout_ms = 180'000;
  // --kv-standby: every stage keeps a KV standby (CONNEX_PP_KV_STANDBY=on), so that a killed
  // stage's requests continue without a re-prefill.
  bool kv_standby = false;
  // steady and proxy-cost only: measure a deployment that runs already, found through this
  // directory (its stage-0 APIs), instead of starting one; `proxy_address` is its proxy.
  std::string directory;
  std::string proxy_address;
  std::string model_name = "tiny";
};

enum class Fault { kKill, kStop, kPartition, kDrain };
absl::StatusOr<Fault> ParseFault(const std::string& name);  // kill, stop, partition, drain
std::string FaultName(Fault fault);

struct FailoverOptions {
  CommonOptions common;
  int runs = 10;
  int kill_stage = -1;  // -1: every stage in turn
  Fault fault = Fault::kKill;
  int batch = 8;     // requests in flight at each fault
  int inflight = 4;  // K
};
// A skip (netns cannot be made for --fault partition) is an OK record with "skipped": reason.
absl::StatusOr<nlohmann::json> RunFailover(const FailoverOptions& options);

struct ChurnOptions {
  CommonOptions common;
  double qps = 2;
  double duration_s = 60;
  double kill_every_s = 10;
  bool proxy = true;
  bool soft = false;  // a graceful leave (SIGTERM) instead of SIGKILL
};
absl::StatusOr<nlohmann::json> RunChurn(const ChurnOptions& options);

struct SteadyOptions {
  CommonOptions common;
  std::vector<double> qps = {1, 2, 4};
  std::vector<int> inflight = {1, 4};
  double duration_s = 30;
  int closed_loop_clients = 8;
};
absl::StatusOr<nlohmann::json> RunSteady(const SteadyOptions& options);

// Open-loop load past what stage 0 admits (CONNEX_STAGE_KV_BUDGET_BYTES and CONNEX_STAGE_QUEUE_MAX
// of every stage 0 set small): every refusal must be a 429 with Retry-After and every admitted
// request exact; /health is probed throughout (its latency printed) and each stage's peak RSS
// reported.
struct OverloadOptions {
  CommonOptions common;
  double qps = 8;
  double duration_s = 20;
  std::string kv_budget = "1M";  // each stage 0's --kv-budget
  int queue_max = 4;             // each stage 0's --queue-max
  int64_t health_every_ms = 20;  // the /health probe's period, on each stage 0
};
absl::StatusOr<nlohmann::json> RunOverload(const OverloadOptions& options);

struct ProxyCostOptions {
  CommonOptions common;
  int requests = 40;  // per path (direct, proxy), one at a time, alternating
};
absl::StatusOr<nlohmann::json> RunProxyCost(const ProxyCostOptions& options);

// `make demo`: the serving stack as its users run it (the binaries' default timeouts; 2 replicas
// of 4 stages, through connex-proxy), `clients` closed-loop streaming clients (greedy and seeded
// sampling, 128 to 256 tokens); after `phase_s` it SIGKILLs stage 2 of replica 0 mid-generation
// and restarts it under the same LID, `phase_s` later stage 0 of replica 1 (not without the
// proxy), then `phase_s` more of load. It checks that every request completed exactly as
// connex-generate's, that each kill found streams in flight that all went on and was noticed
// (failovers, the proxy's resumes), that the restarted stage 0 took traffic, and that every
// process exited 0 on SIGTERM. Progress and events on stderr; DemoReport() is its report.
struct DemoOptions {
  CommonOptions common;  // replicas, stages, max_tokens and seed are the demo's own
  int clients = 4;
  bool proxy = true;  // false: clients use the stage-0 replicas directly; no stage 0 is killed
  double phase_s = 10;
};
absl::StatusOr<nlohmann::json> RunDemo(const DemoOptions& options);
// The demo's report ("=== connex demo report ==="), from its record.
std::string DemoReport(const nlohmann::json& record);

// Prefill-decode disaggregation (docs/design/pd.md): `common.replicas` frontends (the proxy in
// front when more than one), `prefill` and `decode` instances of a 2-stage deployment (decode
// instances with a KV standby when `common.kv_standby`), open-loop Poisson load at `qps` for
// `duration_s`; every `kill_every_s` a prefill or decode instance (`kill`: prefill, decode,
// both in turn, none) is SIGKILLed and restarted half a period later. With `colocated`, the same
// load and kill times on `decode` colocated chains of 2 stages (their stage 1s killed), in the
// same run. Every completion is checked against connex-generate; the record has goodput, TTFT,
// inter-token latency, fault to next token by pool, and the KV handoffs (bytes per request, the
// time a RESULT waited for its handoff, the decode side's read throughput).
struct PdOptions {
  CommonOptions common;
  uint32_t prefill = 2;
  uint32_t decode = 2;
  double qps = 4;
  double duration_s = 30;
  double kill_every_s = 6;
  std::string kill = "both";
  bool colocated = true;
};
absl::StatusOr<nlohmann::json> RunPd(const PdOptions& options);
// `make demo-pd`'s report ("=== connex pd report ==="), from a pd record.
std::string PdReport(const nlohmann::json& record);

// A readable report of any campaign's record (a demo's: DemoReport()).
std::string Summary(const nlohmann::json& record);

}  // namespace connex::chaos

#endif  // CONNEX_CHAOS_CAMPAIGNS_H_
