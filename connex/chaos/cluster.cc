#include "connex/chaos/cluster.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "connex/base/check.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/directory/secret.h"

namespace connex::chaos {
namespace {

// The model connex-chaos makes when given none (as `make demo`'s): 8 layers of dim 256,
// two layers per stage of a 4-stage pipeline.
const std::vector<std::string> kMkmodelFlags = {"--layers",   "8", "--dim", "256", "--heads", "4",
                                                "--kv-heads", "2", "--ffn", "512", "--seed",  "7"};

// Waits for a line containing `needle` and returns the first match of `pattern` in it.
absl::StatusOr<std::string> WaitForMatch(Subprocess& p, const std::string& what,
                                         const std::string& needle, const std::regex& pattern,
                                         int64_t timeout_ms, const std::string& log) {
  std::optional<std::string> line = p.WaitForLine(needle, timeout_ms);
  if (!line) {
    std::optional<int> code = p.Wait(0);
    return absl::UnavailableError(StrCat(what, ": no \"", needle, "\" line within ", timeout_ms,
                                         " ms", code ? StrCat(" (exited ", *code, ")") : "",
                                         "; see ", log));
  }
  std::smatch m;
  if (!std::regex_search(*line, m, pattern)) {
    return absl::InternalError(StrCat(what, ": unexpected line \"", *line, "\""));
  }
  return std::string(m[1]);
}

}  // namespace

absl::Status MakeModel(const std::string& bin_dir, const std::string& path,
                       const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {bin_dir + "/connex-mkmodel", "--out", path};
  argv.insert(argv.end(), flags.begin(), flags.end());
  SubprocessOptions so;
  so.capture_stderr = true;
  std::string error;
  std::optional<Subprocess> mk = Subprocess::Start(argv, so, &error);
  if (!mk) return absl::InternalError("connex-mkmodel: " + error);
  while (mk->ReadLine(60'000)) {
  }
  if (mk->Wait(60'000) != 0) {
    return absl::InternalError("connex-mkmodel failed: " + mk->transcript());
  }
  return absl::OkStatus();
}

std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    if (space == std::string_view::npos) continue;
    double value = 0;
    if (!absl::SimpleAtod(absl::string_view(line.data() + space + 1, line.size() - space - 1),
                          &value))
      continue;
    out[std::string(line.substr(0, space))] = value;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(ClusterOptions options) {
  if (options.replicas == 0 || options.stages == 0) {
    return absl::InvalidArgumentError("a cluster needs at least one replica of one stage");
  }
  if (options.netns) options.backend = "tcp";  // shm's unix sockets do not cross namespaces
  std::unique_ptr<Cluster> c(new Cluster(std::move(options)));
  if (absl::Status s = c->StartAll(); !s.ok()) return s;  // the destructor cleans up
  return c;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Attach(ClusterOptions options,
                                                         const std::string& directory,
                                                         const std::string& proxy) {
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError(
        "--directory: give --model, the checkpoint the deployment serves (for the references)");
  }
  std::unique_ptr<Cluster> c(new Cluster(std::move(options)));
  c->attached_ = true;
  c->model_path_ = c->options_.model_path;
  c->directory_ = directory;
  // Every setting a directory client honours (token, CURVE) from the environment.
  CONNEX_ASSIGN_OR_RETURN(directory::DirectoryClientOptions dco,
                          directory::DirectoryClientOptions::FromEnv());
  dco.directory = directory;
  CONNEX_ASSIGN_OR_RETURN(c->watcher_, directory::DirectoryClient::Connect(dco));
  CONNEX_RETURN_IF_ERROR(c->watcher_->Watch(c->options_.model_name));
  uint32_t replicas = 0;
  for (const directory::Record& r : c->watcher_->View(c->options_.model_name)) {
    auto http = r.metadata.find("http");
    if (r.lid.group != 0 || http == r.metadata.end()) continue;
    absl::StatusOr<HostPort> api = ParseHostPort(r.lid.ToString() + " metadata http", http->second);
    if (!api.ok()) return api.status();
    // Replicas are numbered here in the order found, whatever their LIDs' replica numbers.
    StageProc& sp = c->at(0, replicas++);
    sp.api = sp.metrics = *api;
    sp.epoch = r.epoch;
  }
  if (replicas == 0) {
    return absl::NotFoundError(StrCat("--directory ", directory, ": no stage 0 of model ",
                                      c->options_.model_name, " publishes an API (metadata http)"));
  }
  c->options_.replicas = replicas;
  if (!proxy.empty()) {
    CONNEX_ASSIGN_OR_RETURN(HostPort at, ParseHostPort("--proxy-address", proxy));
    c->proxy_ = at;
  }
  CONNEX_RETURN_IF_ERROR(c->WaitAllHealthy(c->options_.start_timeout_ms));
  return c;
}

absl::Status Cluster::StartAll() {
  const ClusterOptions& o = options_;
  if (o.netns) CONNEX_RETURN_IF_ERROR(MakeNetwork());
  model_path_ = o.model_path;
  if (model_path_.empty()) {
    std::filesystem::create_directories(o.work_dir + "/" + o.model_name);
    model_path_ = o.work_dir + "/" + o.model_name + "/model.safetensors";
    CONNEX_RETURN_IF_ERROR(MakeModel(o.bin_dir, model_path_, kMkmodelFlags));
  }
  // The directory.
  {
    SubprocessOptions so;
    so.stderr_path = o.work_dir + "/directory.log";
    // The bridge's addresses are not loopback ones: a test network of this tool's own.
    if (o.netns) so.env.push_back("CONNEX_INSECURE=1");
    // The operator's secret, for drains (never in argv).
    admin_token_ = directory::NewCredential();
    so.env.push_back("CONNEX_DIRECTORY_ADMIN_TOKEN=" + admin_token_);
    std::string error;
    directory_process_ = Subprocess::Start(
        {o.bin_dir + "/connex-directory", "--bind", "tcp://" + host_ + ":0", "--pub",
         "tcp://" + host_ + ":0", "--lease-ttl-ms", StrCat(o.lease_ttl_ms), "--heartbeat-ms",
         StrCat(o.heartbeat_ms), "--log-level", "warn"},
        so, &error);
    if (!directory_process_) return absl::InternalError("connex-directory: " + error);
    CONNEX_ASSIGN_OR_RETURN(
        directory_, WaitForMatch(*directory_process_, "connex-directory", "listening",
                                 std::regex("bind=(tcp://[0-9.]+:[0-9]+)"), o.start_timeout_ms,
                                 so.stderr_path));
  }
  CONNEX_ASSIGN_OR_RETURN(directory::DirectoryClientOptions dco,
                          directory::DirectoryClientOptions::FromEnv());
  dco.directory = directory_;
  if (!admin_token_.empty()) dco.admin_token = admin_token_;
  CONNEX_ASSIGN_OR_RETURN(watcher_, directory::DirectoryClient::Connect(dco));
  CONNEX_RETURN_IF_ERROR(watcher_->Watch(o.model_name));
  // Every stage (and the proxy) starts at once: each loads its model (stage 0 its tokenizer too)
  // while the others do; then each is awaited. Last stages first, so that a chain is whole as
  // soon as its stage 0 is up.
  std::vector<std::pair<uint32_t, uint32_t>> started;  // (stage, replica)
  if (o.pd()) {
    if (o.stages != 2 || o.pd_decode == 0) {
      return absl::InvalidArgumentError(
          StrCat("a prefill-decode deployment has 2 stages and both pools (stages ", o.stages,
                 ", prefill ", o.pd_prefill, ", decode ", o.pd_decode, ")"));
    }
    for (uint32_t g = o.groups(); g-- > 0;) {
      for (uint32_t r = 0; r < o.members(g); ++r) started.emplace_back(g, r);
    }
  } else {
    for (uint32_t r = 0; r < o.replicas; ++r) {
      for (uint32_t s = o.stages; s-- > 0;) started.emplace_back(s, r);
    }
  }
  for (auto [stage, replica] : started) CONNEX_RETURN_IF_ERROR(LaunchStage(stage, replica));
  if (o.proxy) CONNEX_RETURN_IF_ERROR(LaunchProxy());
  for (auto [stage, replica] : started) CONNEX_RETURN_IF_ERROR(AwaitStage(stage, replica));
  CONNEX_RETURN_IF_ERROR(WaitAllHealthy(o.start_timeout_ms));
  if (o.proxy) CONNEX_RETURN_IF_ERROR(AwaitProxy());
  return absl::OkStatus();
}

absl::Status Cluster::LaunchProxy() {
  const ClusterOptions& o = options_;
  SubprocessOptions so;
  so.stderr_path = o.work_dir + "/proxy.log";
  if (o.netns) so.env.push_back("CONNEX_INSECURE=1");
  std::string error;
  so.env.insert(so.env.end(), o.proxy_env.begin(), o.proxy_env.end());
  std::vector<std::string> argv = {o.bin_dir + "/connex-proxy",
                                   "--directory",
                                   directory_,
                                   "--model",
                                   o.model_name,
                                   "--listen",
                                   host_ + ":0",
                                   "--log-level",
                                   "warn"};
  if (o.proxy_idle_timeout_ms > 0) {
    argv.insert(argv.end(), {"--idle-timeout-ms", StrCat(o.proxy_idle_timeout_ms)});
  }
  proxy_process_ = Subprocess::Start(argv, so, &error);
  if (!proxy_process_) return absl::InternalError("connex-proxy: " + error);
  return absl::OkStatus();
}

absl::Status Cluster::AwaitProxy() {
  const ClusterOptions& o = options_;
  const std::string log = o.work_dir + "/proxy.log";
  CONNEX_ASSIGN_OR_RETURN(
      std::string at, WaitForMatch(*proxy_process_, "connex-proxy", "listening http=",
                                   std::regex("http=([0-9.]+:[0-9]+)"), o.start_timeout_ms, log));
  CONNEX_ASSIGN_OR_RETURN(proxy_, ParseHostPort("proxy", at));
  // Ready once it has found every replica.
  const uint32_t want = o.replicas;
  bool ready = WaitUntil(
      [&] {
        absl::StatusOr<HttpReply> r = HttpGet(*proxy_, "/metrics", 2000);
        if (!r.ok() || r->status != 200) return false;
        auto m = ParseMetrics(r->body);
        auto it = m.find("connex_proxy_replicas");
        return it != m.end() && it->second >= want;
      },
      o.start_timeout_ms, 20);
  if (!ready) {
    return absl::UnavailableError(
        StrCat("connex-proxy never saw the ", want, " replicas; see ", log));
  }
  return absl::OkStatus();
}

Cluster::~Cluster() {
  proxy_process_.reset();
  watcher_.reset();
  for (auto& [key, s] : stages_) {
    if (s.process) s.process->Signal(SIGCONT);  // a stopped process is killed all the same
    s.process.reset();
  }
  directory_process_.reset();
  RemoveNetwork();
}

Cluster::StageProc& Cluster::at(uint32_t stage, uint32_t replica) {
  return stages_[{stage, replica}];
}
const Cluster::StageProc& Cluster::at(uint32_t stage, uint32_t replica) const {
  return stages_.at({stage, replica});
}

std::string Cluster::log_path(uint32_t stage, uint32_t replica) const {
  return StrCat(options_.work_dir, "/stage-", stage, "-r", replica, ".log");
}

absl::Status Cluster::StartStage(uint32_t stage, uint32_t replica,
                                 const std::vector<std::string>& extra_env) {
  CONNEX_RETURN_IF_ERROR(LaunchStage(stage, replica, extra_env));
  return AwaitStage(stage, replica);
}

absl::Status Cluster::LaunchStage(uint32_t stage, uint32_t replica,
                                  const std::vector<std::string>& extra_env) {
  const ClusterOptions& o = options_;
  const std::string host = StageHost(stage, replica);
  std::vector<std::string> argv = {o.bin_dir + "/connex-stage",
                                   "--directory",
                                   directory_,
                                   "--model",
                                   model_path_,
                                   "--model-name",
                                   o.model_name,
                                   "--stage",
                                   StrCat(o.pd() ? (stage == 0 ? 0 : 1) : stage),
                                   "--stages",
                                   StrCat(o.stages),
                                   "--replica",
                                   StrCat(replica),
                                   "--backend",
                                   o.backend,
                                   "--log-level",
                                   "warn"};
  if (o.pd()) {
    static constexpr const char* kRoles[] = {"frontend", "prefill", "decode"};
    argv.insert(argv.end(), {"--pd-role", kRoles[std::min<uint32_t>(stage, 2)]});
  }
  argv.push_back(stage == 0 ? "--http" : "--metrics");
  argv.push_back(host + ":0");
  SubprocessOptions so;
  so.env = {"CONNEX_ENGINE_THREADS=1", "CONNEX_SIGNAL_HOST=" + host,
            "CONNEX_TRANSPORT_HOST=" + host,
            StrCat("CONNEX_PP_STEP_TIMEOUT_MS=", o.step_timeout_ms),
            StrCat("CONNEX_PP_PROBE_TIMEOUT_MS=", o.probe_timeout_ms)};
  if (o.inflight > 0) so.env.push_back(StrCat("CONNEX_PP_INFLIGHT=", o.inflight));
  so.env.push_back(StrCat("CONNEX_PP_KV_STANDBY=", o.kv_standby ? "on" : "off"));
  // Stage 0's streams keep alive well within the proxy's idle timeout, so that only a hung or
  // cut-off stage 0 is silent that long.
  if (stage == 0 && o.proxy_idle_timeout_ms > 0) {
    so.env.push_back(StrCat("CONNEX_STAGE_STREAM_KEEPALIVE_MS=",
                            std::max<int64_t>(1, o.proxy_idle_timeout_ms / 4)));
  }
  if (o.netns) so.env.push_back("CONNEX_INSECURE=1");  // the tool's own test network
  so.env.insert(so.env.end(), o.stage_env.begin(), o.stage_env.end());
  so.env.insert(so.env.end(), extra_env.begin(), extra_env.end());
  so.stderr_path = log_path(stage, replica);
  if (o.netns) so.netns = NetnsName(stage, replica);
  const std::string what = StrCat("connex-stage ", stage, " of replica ", replica);
  std::string error;
  std::optional<Subprocess> p = Subprocess::Start(argv, so, &error);
  if (!p) return absl::InternalError(what + ": " + error);
  StageProc& sp = at(stage, replica);
  sp = StageProc();
  sp.process = std::move(p);
  return absl::OkStatus();
}

absl::Status Cluster::AwaitStage(uint32_t stage, uint32_t replica) {
  const ClusterOptions& o = options_;
  const std::string what = StrCat("connex-stage ", stage, " of replica ", replica);
  StageProc& sp = at(stage, replica);
  CONNEX_CHECK(sp.process.has_value());  // LaunchStage came first
  const std::string needle = stage == 0 ? "listening http=" : "listening metrics=";
  CONNEX_ASSIGN_OR_RETURN(std::string addr,
                          WaitForMatch(*sp.process, what, needle, std::regex("=([0-9.]+:[0-9]+)"),
                                       o.start_timeout_ms, log_path(stage, replica)));
  CONNEX_ASSIGN_OR_RETURN(sp.metrics, ParseHostPort(what, addr));
  if (stage == 0) sp.api = sp.metrics;
  CONNEX_ASSIGN_OR_RETURN(std::string epoch,
                          WaitForMatch(*sp.process, what, "ready ", std::regex("epoch=([0-9]+)"),
                                       o.start_timeout_ms, log_path(stage, replica)));
  sp.epoch = std::stoull(epoch);
  return absl::OkStatus();
}

HostPort Cluster::api(uint32_t replica) const { return at(0, replica).api; }
HostPort Cluster::metrics(uint32_t stage, uint32_t replica) const {
  return at(stage, replica).metrics;
}
uint64_t Cluster::started_epoch(uint32_t stage, uint32_t replica) const {
  return at(stage, replica).epoch;
}

bool Cluster::running(uint32_t stage, uint32_t replica) {
  StageProc& s = at(stage, replica);
  return s.process.has_value() && !s.process->Exited();
}

int Cluster::pid(uint32_t stage, uint32_t replica) const {
  const StageProc& s = at(stage, replica);
  return s.process ? s.process->pid() : 0;
}

absl::Status Cluster::CheckRunning() {
  auto exited = [](std::optional<Subprocess>& p, const std::string& what, const std::string& log) {
    if (!p || !p->Exited()) return absl::OkStatus();
    return absl::UnavailableError(
        StrCat(what, " exited by itself (code ", p->Wait(0).value_or(-1), "); see ", log));
  };
  CONNEX_RETURN_IF_ERROR(
      exited(directory_process_, "connex-directory", options_.work_dir + "/directory.log"));
  for (auto& [key, s] : stages_) {
    CONNEX_RETURN_IF_ERROR(
        exited(s.process, lid(key.first, key.second).ToString(), log_path(key.first, key.second)));
  }
  return exited(proxy_process_, "connex-proxy", options_.work_dir + "/proxy.log");
}

std::vector<std::string> Cluster::StopAll(int64_t grace_ms) {
  std::vector<std::string> problems;
  auto stop = [&](std::optional<Subprocess>& p, const std::string& what, const std::string& log) {
    if (!p) return;
    if (p->Exited()) {
      problems.push_back(
          StrCat(what, " had exited by itself (code ", p->Wait(0).value_or(-1), "); see ", log));
    } else {
      p->Signal(SIGTERM);
      std::optional<int> code = p->Wait(grace_ms);
      if (!code) {
        p->Signal(SIGKILL);
        p->Wait(10'000);
        problems.push_back(
            StrCat(what, " did not exit within ", grace_ms, " ms of SIGTERM; see ", log));
      } else if (*code != 0) {
        problems.push_back(StrCat(what, " exited ", *code, " on SIGTERM; see ", log));
      }
    }
    p.reset();
  };
  if (attached_) return problems;
  stop(proxy_process_, "connex-proxy", options_.work_dir + "/proxy.log");
  for (uint32_t s = 0; s < options_.groups(); ++s) {
    for (uint32_t r = options_.members(s); r-- > 0;) {
      if (stages_.count({s, r}) == 0) continue;
      stop(at(s, r).process, lid(s, r).ToString(), log_path(s, r));
    }
  }
  watcher_.reset();  // before its directory goes
  stop(directory_process_, "connex-directory", options_.work_dir + "/directory.log");
  return problems;
}

absl::Status Cluster::Kill(uint32_t stage, uint32_t replica) {
  if (attached_) return absl::FailedPreconditionError("faults need processes this tool started");
  StageProc& s = at(stage, replica);
  if (!s.process)
    return absl::FailedPreconditionError(StrCat("stage ", stage, "/r", replica, " is not running"));
  s.process->Signal(SIGKILL);
  s.process->Wait(10'000);
  s.process.reset();
  return absl::OkStatus();
}

absl::Status Cluster::Stop(uint32_t stage, uint32_t replica) {
  if (attached_) return absl::FailedPreconditionError("faults need processes this tool started");
  StageProc& s = at(stage, replica);
  if (!s.process) return absl::FailedPreconditionError("not running");
  s.process->Signal(SIGSTOP);
  return absl::OkStatus();
}

absl::Status Cluster::Resume(uint32_t stage, uint32_t replica) {
  StageProc& s = at(stage, replica);
  if (!s.process) return absl::FailedPreconditionError("not running");
  s.process->Signal(SIGCONT);
  return absl::OkStatus();
}

absl::Status Cluster::Leave(uint32_t stage, uint32_t replica, int64_t timeout_ms) {
  if (attached_) return absl::FailedPreconditionError("faults need processes this tool started");
  StageProc& s = at(stage, replica);
  if (!s.process) return absl::FailedPreconditionError("not running");
  s.process->Signal(SIGTERM);
  std::optional<int> code = s.process->Wait(timeout_ms);
  if (!code) {
    s.process->Signal(SIGKILL);
    s.process->Wait(10'000);
    s.process.reset();
    return absl::DeadlineExceededError(
        StrCat("stage ", stage, "/r", replica, " did not leave within ", timeout_ms, " ms"));
  }
  s.process.reset();
  return absl::OkStatus();
}

int64_t Cluster::PeakRssBytes(uint32_t stage, uint32_t replica) const {
  const StageProc& s = at(stage, replica);
  if (!s.process) return 0;
  std::ifstream status(StrCat("/proc/", s.process->pid(), "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    int64_t kib = 0;
    std::istringstream(line.substr(6)) >> kib;
    return kib * 1024;
  }
  return 0;
}

absl::StatusOr<int> Cluster::Drain(uint32_t stage, uint32_t replica, int64_t timeout_ms) {
  if (attached_) return absl::FailedPreconditionError("faults need processes this tool started");
  if (!at(stage, replica).process) return absl::FailedPreconditionError("not running");
  CONNEX_RETURN_IF_ERROR(watcher_->Evict(lid(stage, replica)));
  absl::StatusOr<int> code = WaitExit(stage, replica, timeout_ms);
  if (absl::IsDeadlineExceeded(code.status())) {
    return absl::DeadlineExceededError(StrCat(
        "stage ", stage, "/r", replica, " did not exit within ", timeout_ms, " ms of its drain"));
  }
  return code;
}

absl::StatusOr<int> Cluster::WaitExit(uint32_t stage, uint32_t replica, int64_t timeout_ms) {
  if (attached_) return absl::FailedPreconditionError("faults need processes this tool started");
  StageProc& s = at(stage, replica);
  if (!s.process) return absl::FailedPreconditionError("not running");
  std::optional<int> code = s.process->Wait(timeout_ms);
  if (!code) {
    s.process->Signal(SIGKILL);
    s.process->Wait(10'000);
    s.process.reset();
    return absl::DeadlineExceededError(
        StrCat("stage ", stage, "/r", replica, " did not exit within ", timeout_ms, " ms"));
  }
  s.process.reset();
  return *code;
}

absl::Status Cluster::Restart(uint32_t stage, uint32_t replica,
                              std::vector<std::string> extra_env) {
  if (attached_) return absl::FailedPreconditionError("faults need processes this tool started");
  StageProc& s = at(stage, replica);
  if (s.process && !s.process->Exited()) {
    return absl::FailedPreconditionError(StrCat("stage ", stage, "/r", replica, " is running"));
  }
  s.process.reset();
  return StartStage(stage, replica, extra_env);
}

absl::Status Cluster::WaitHealthy(uint32_t replica, int64_t timeout_ms) {
  const HostPort a = api(replica);
  if (WaitUntil(
          [&] {
            absl::StatusOr<HttpReply> r = HttpGet(a, "/health", 2000);
            return r.ok() && r->status == 200;
          },
          timeout_ms, 20)) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(StrCat("replica ", replica, " (", a.ToString(),
                                       ") not healthy within ", timeout_ms, " ms; see ",
                                       log_path(0, replica)));
}

absl::Status Cluster::WaitAllHealthy(int64_t timeout_ms) {
  for (uint32_t r = 0; r < options_.replicas; ++r) {
    CONNEX_RETURN_IF_ERROR(WaitHealthy(r, timeout_ms));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, double>> Cluster::Metrics(uint32_t stage, uint32_t replica) {
  CONNEX_ASSIGN_OR_RETURN(HttpReply r, HttpGet(metrics(stage, replica), "/metrics", 5000));
  if (r.status != 200) {
    return absl::UnavailableError(
        StrCat("/metrics of stage ", stage, "/r", replica, ": HTTP ", r.status));
  }
  return ParseMetrics(r.body);
}

double Cluster::SumMetric(const std::string& name) {
  double sum = 0;
  for (auto& [key, s] : stages_) {
    if (!s.process) continue;
    absl::StatusOr<std::map<std::string, double>> m = Metrics(key.first, key.second);
    if (!m.ok()) continue;
    if (auto it = m->find(name); it != m->end()) sum += it->second;
  }
  return sum;
}

uint64_t Cluster::DirectoryEpoch(uint32_t stage, uint32_t replica) {
  const Lid want = lid(stage, replica);
  for (const directory::Record& r : watcher_->View(options_.model_name)) {
    if (r.lid == want) return r.epoch;
  }
  return 0;
}

}  // namespace connex::chaos
