// Cluster: a whole serving deployment that connex-chaos starts, faults and stops — a directory,
// `replicas` chains of `stages` connex-stage processes (stage 0 of each serving the API, every
// other stage its /metrics), and the resume proxy; every process on a free port. On loopback by
// default; with `netns`, every stage process runs in a network namespace of its own, joined to
// the others by a veth pair on one bridge, so that a stage's links can be cut while it stays
// alive (Partition). Everything it made (processes, namespaces, links, files) goes with it.
// Thread-compatible; start and restart processes from one long-lived thread (a child dies with
// the thread that started it).
#ifndef CONNEX_CHAOS_CLUSTER_H_
#define CONNEX_CHAOS_CLUSTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/lid.h"
#include "connex/base/subprocess.h"
#include "connex/chaos/http_client.h"
#include "connex/directory/client.h"

namespace connex::chaos {

struct ClusterOptions {
  std::string bin_dir;     // connex-directory, connex-stage, connex-proxy, connex-mkmodel
  std::string work_dir;    // logs and the model it makes; must exist
  std::string model_path;  // empty: a small model made with connex-mkmodel in work_dir
  std::string model_name = "tiny";
  uint32_t replicas = 2;
  uint32_t stages = 4;
  std::string backend = "tcp";  // the stages' data plane (tcp in netns mode; "auto": theirs)
  bool proxy = true;
  bool netns = false;
  int inflight = 0;  // CONNEX_PP_INFLIGHT of the stages; 0: their default (4)
  // Failure detection of the deployment: the directory's lease and heartbeat, the stages' step
  // and probe timeouts (a hung or cut-off stage is suspected after a step timeout, and replaced
  // when it misses a probe).
  int64_t lease_ttl_ms = 1500;
  int64_t heartbeat_ms = 300;
  int64_t step_timeout_ms = 1000;
  int64_t probe_timeout_ms = 300;
  // A replica whose response stays silent this long is taken as dead by the proxy (a hung or
  // cut-off stage 0), which resumes the request elsewhere; 0: the proxy's default. Stage 0s then
  // keep their streams alive every quarter of it (CONNEX_STAGE_STREAM_KEEPALIVE_MS) while they
  // work, through a failover behind them; 0 leaves them their default.
  int64_t proxy_idle_timeout_ms = 1500;
  bool kv_standby = false;             // CONNEX_PP_KV_STANDBY of every stage
  std::vector<std::string> stage_env;  // more NAME=VALUE for every stage
  std::vector<std::string> proxy_env;  // more NAME=VALUE for the proxy
  int64_t start_timeout_ms = 60'000;
  // Prefill-decode disaggregation (docs/design/pd.md): with pd_prefill > 0 the deployment is
  // `replicas` frontends (connex-stage --pd-role frontend: the API, stage 0 of 2), `pd_prefill`
  // prefill and `pd_decode` decode instances (stage 1 of 2, every layer); `stages` must be 2, and
  // every method's `stage` is a PD group: 0 a frontend, 1 a prefill, 2 a decode instance.
  uint32_t pd_prefill = 0;
  uint32_t pd_decode = 0;
  bool pd() const { return pd_prefill > 0; }
  // The groups of the deployment (PD: 3; else the stages).
  uint32_t groups() const { return pd() ? 3 : stages; }
  // How many processes of `group` it runs (PD: frontends, prefill, decode; else replicas).
  uint32_t members(uint32_t group) const {
    if (!pd() || group == 0) return replicas;
    return group == 1 ? pd_prefill : pd_decode;
  }
};

class Cluster {
 public:
  // Starts everything and waits until every replica is healthy. Errors name the process that
  // failed and its log; nothing is left running.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(ClusterOptions options);
  // A deployment someone else runs: its stage-0 replicas of `options.model_name` (those that
  // publish an API, metadata "http") found through the directory at `directory`, and the proxy
  // at `proxy` if given. Nothing is started, so nothing can be faulted (the fault methods fail
  // with FailedPrecondition); `options.model_path` must be the checkpoint it serves (for the
  // references) and `options.stages` its pipeline's length.
  static absl::StatusOr<std::unique_ptr<Cluster>> Attach(ClusterOptions options,
                                                         const std::string& directory,
                                                         const std::string& proxy);
  bool attached() const { return attached_; }
  ~Cluster();

  const ClusterOptions& options() const { return options_; }
  const std::string& model_path() const { return model_path_; }
  const std::string& directory() const { return directory_; }
  // The operator's secret of the directory it started (CONNEX_DIRECTORY_ADMIN_TOKEN), for a
  // `connexctl drain` of one's own; empty when attached.
  const std::string& admin_token() const { return admin_token_; }
  // Stage 0's API of `replica`, and the proxy's (when it runs).
  HostPort api(uint32_t replica) const;
  std::optional<HostPort> proxy() const { return proxy_; }
  // Where stage (stage, replica) serves /metrics (stage 0: its API).
  HostPort metrics(uint32_t stage, uint32_t replica) const;
  Lid lid(uint32_t stage, uint32_t replica) const {
    return Lid{options_.model_name, stage, 0, replica};
  }
  // The epoch its process printed when it joined (its first; a rejoin after an eviction makes
  // another, which the directory knows).
  uint64_t started_epoch(uint32_t stage, uint32_t replica) const;
  bool running(uint32_t stage, uint32_t replica);
  // Its process id; 0 when it is not running.
  int pid(uint32_t stage, uint32_t replica) const;
  std::string log_path(uint32_t stage, uint32_t replica) const;
  // Unavailable naming the first process of the deployment (directory, a stage, the proxy) that
  // exited by itself, and its log; OK when every one runs but those a fault took down.
  absl::Status CheckRunning();
  // Stops the deployment gracefully: SIGTERM to the proxy, every stage (a graceful leave) and
  // the directory, in that order, each given `grace_ms` to exit. Returns its problems: a process
  // that had exited by itself, exited non-zero, or had to be SIGKILLed. Only the destructor may
  // follow.
  std::vector<std::string> StopAll(int64_t grace_ms);

  // Faults. Kill: SIGKILL and reap. Stop / Resume: SIGSTOP / SIGCONT. Partition / Heal: its
  // veth link down / up (netns mode only). Leave: SIGTERM, waits for the graceful exit.
  absl::Status Kill(uint32_t stage, uint32_t replica);
  absl::Status Stop(uint32_t stage, uint32_t replica);
  absl::Status Resume(uint32_t stage, uint32_t replica);
  absl::Status Partition(uint32_t stage, uint32_t replica);
  absl::Status Heal(uint32_t stage, uint32_t replica);
  absl::Status Leave(uint32_t stage, uint32_t replica, int64_t timeout_ms = 30'000);
  // An operator's drain (`connexctl drain`: its LID LEFT with the admin token of the directory
  // this tool started), then waits for the process to exit by itself; its exit code.
  absl::StatusOr<int> Drain(uint32_t stage, uint32_t replica, int64_t timeout_ms = 30'000);
  // Waits for a stage to exit by itself (a drain someone else asked for); its exit code.
  // DeadlineExceeded, after which it is SIGKILLed, when it does not within `timeout_ms`.
  absl::StatusOr<int> WaitExit(uint32_t stage, uint32_t replica, int64_t timeout_ms);
  // The peak resident memory of a stage's process (VmHWM), in bytes; 0 when it cannot be read.
  int64_t PeakRssBytes(uint32_t stage, uint32_t replica) const;
  // Starts a stage that is not running again, under the same LID, and waits for its ready line;
  // `extra_env` (NAME=VALUE) is added to its environment for this start only.
  absl::Status Restart(uint32_t stage, uint32_t replica, std::vector<std::string> extra_env = {});
  // Waits until stage 0 of `replica` says healthy (the whole chain is in the directory).
  absl::Status WaitHealthy(uint32_t replica, int64_t timeout_ms);
  absl::Status WaitAllHealthy(int64_t timeout_ms);

  // The stage's /metrics, as name{labels} -> value.
  absl::StatusOr<std::map<std::string, double>> Metrics(uint32_t stage, uint32_t replica);
  // The sum of one metric (exact name, no labels) over every stage that answers.
  double SumMetric(const std::string& name);

  // A watching directory client (model `model_name`), for waiting on evictions and rejoins.
  directory::DirectoryClient& watcher() { return *watcher_; }
  // The epoch the directory shows for the stage now (0: no record).
  uint64_t DirectoryEpoch(uint32_t stage, uint32_t replica);

 private:
  struct StageProc {
    std::optional<Subprocess> process;
    HostPort api;      // stage 0
    HostPort metrics;  // every stage (stage 0: = api)
    uint64_t epoch = 0;
  };
  explicit Cluster(ClusterOptions options) : options_(std::move(options)) {}
  absl::Status StartAll();
  absl::Status StartStage(uint32_t stage, uint32_t replica,
                          const std::vector<std::string>& extra_env = {});
  // StartStage in two halves: start the process; then wait for its address and its "ready".
  absl::Status LaunchStage(uint32_t stage, uint32_t replica,
                           const std::vector<std::string>& extra_env = {});
  absl::Status AwaitStage(uint32_t stage, uint32_t replica);
  absl::Status LaunchProxy();
  absl::Status AwaitProxy();  // its address, then every replica seen
  absl::Status MakeNetwork();
  void RemoveNetwork();
  std::string host() const { return host_; }
  std::string StageHost(uint32_t stage, uint32_t replica) const;
  std::string NetnsName(uint32_t stage, uint32_t replica) const;
  std::string LinkName(uint32_t stage, uint32_t replica) const;
  StageProc& at(uint32_t stage, uint32_t replica);
  const StageProc& at(uint32_t stage, uint32_t replica) const;

  ClusterOptions options_;
  std::string model_path_;
  std::string host_ = "127.0.0.1";  // where the directory and the proxy bind
  std::string directory_;
  std::optional<Subprocess> directory_process_;
  std::optional<Subprocess> proxy_process_;
  std::optional<HostPort> proxy_;
  std::map<std::pair<uint32_t, uint32_t>, StageProc> stages_;
  std::unique_ptr<directory::DirectoryClient> watcher_;
  std::string admin_token_;  // of the directory this tool started (for Drain)
  // netns mode
  std::string net_prefix_;  // names of the namespaces, links and bridge start with it
  int subnet_ = 0;          // 10.231.<subnet>.0/24
  bool network_made_ = false;
  bool attached_ = false;  // Attach: processes of someone else's
};

// Makes a model of random weights at `path` (its folder must exist) with connex-mkmodel of
// `bin_dir` and `flags` (--layers, --dim, ...); Internal with its output when it fails.
absl::Status MakeModel(const std::string& bin_dir, const std::string& path,
                       const std::vector<std::string>& flags);

// Runs `ip` with `args` (the iproute2 binary), returning its error output when it fails.
absl::Status RunIp(const std::vector<std::string>& args);
// Whether network namespaces, veth pairs and bridges can be made here (root, iproute2); the
// reason when not.
absl::Status NetnsAvailable();

// Removes every namespace, link and bridge a Cluster of this process made and has not removed
// yet (for a tool stopped by a signal). Safe to call from any thread.
void RemoveNetworksOfThisProcess();

// Prometheus text exposition -> name{labels} -> value.
std::map<std::string, double> ParseMetrics(const std::string& text);

}  // namespace connex::chaos

#endif  // CONNEX_CHAOS_CLUSTER_H_
