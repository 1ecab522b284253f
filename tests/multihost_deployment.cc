#include "tests/multihost_deployment.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/subprocess.h"
#include "connex/base/wait.h"
#include "connex/chaos/cluster.h"
#include "nlohmann/json.hpp"

namespace connex::testing {
namespace {

// Runs `argv` here to completion; its output, or Internal with it.
absl::StatusOr<std::string> Run(const std::vector<std::string>& argv,
                                const std::vector<std::string>& env = {},
                                int64_t timeout_ms = 30'000) {
  SubprocessOptions so;
  so.capture_stderr = true;
  so.env = env;
  std::string error;
  std::optional<Subprocess> p = Subprocess::Start(argv, so, &error);
  if (!p) return absl::InternalError(StrCat(argv[0], ": ", error));
  while (p->ReadLine(timeout_ms)) {
  }
  std::optional<int> code = p->Wait(timeout_ms);
  if (code != 0) {
    std::string cmd;
    for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return absl::InternalError(StrCat(cmd, " failed: ", p->transcript()));
  }
  return p->transcript();
}

// (leader, this member) of `etcdctl endpoint status -w json` for one endpoint; nullopt when the
// output is not that (never throws: the output is another program's).
std::optional<std::pair<uint64_t, uint64_t>> LeaderAndSelf(const std::string& out) {
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_array() || j.empty() || !j[0].is_object()) return std::nullopt;
  const nlohmann::json& status = j[0].value("Status", nlohmann::json::object());
  if (!status.is_object() || !status.contains("leader") || !status.contains("header")) {
    return std::nullopt;
  }
  const nlohmann::json& leader = status["leader"];
  const nlohmann::json& self = status["header"].value("member_id", nlohmann::json());
  if (!leader.is_number_unsigned() || !self.is_number_unsigned()) return std::nullopt;
  return std::make_pair(leader.get<uint64_t>(), self.get<uint64_t>());
}

// The deployment's processes log at CONNEX_HOSTS_LOG_LEVEL (default warn).
std::string LogLevel() {
  const char* level = std::getenv("CONNEX_HOSTS_LOG_LEVEL");
  return level != nullptr && *level != '\0' ? level : "info";
}

}  // namespace

absl::StatusOr<std::unique_ptr<MultiHostDeployment>> MultiHostDeployment::Start(
    MultiHostOptions options) {
  std::unique_ptr<MultiHostDeployment> d(new MultiHostDeployment(std::move(options)));
  CONNEX_RETURN_IF_ERROR(d->StartAll());  // the destructor (of hosts_) stops what started
  return d;
}

int MultiHostDeployment::HostOf(uint32_t stage, uint32_t replica) {
  return 1 + static_cast<int>((stage + replica) % 2);  // s0r0, s1r1 on 1; s1r0, s0r1 on 2
}

chaos::HostPort MultiHostDeployment::proxy() const { return {hosts_->address(kProxyHost), 8000}; }
chaos::HostPort MultiHostDeployment::api(uint32_t replica) const {
  return {hosts_->address(HostOf(0, replica)), static_cast<uint16_t>(8001 + replica)};
}
chaos::HostPort MultiHostDeployment::metrics(uint32_t stage, uint32_t replica) const {
  if (stage == 0) return api(replica);
  return {hosts_->address(HostOf(stage, replica)),
          static_cast<uint16_t>(8100 + stage * 10 + replica)};
}

std::string MultiHostDeployment::directory() const {
  std::string out = "etcd://";
  for (int m = 0; m < 3; ++m) out += StrCat(m ? "," : "", hosts_->address(m + 1), ":2379");
  return out;
}

absl::Status MultiHostDeployment::StartAll() {
  const MultiHostOptions& o = options_;
  chaos::HostsOptions ho;
  ho.hosts = kHosts;
  ho.work_dir = o.work_dir;
  CONNEX_ASSIGN_OR_RETURN(hosts_, chaos::Hosts::Make(ho));
  CONNEX_RETURN_IF_ERROR(MakePki());
  std::filesystem::create_directories(o.work_dir + "/m/tiny");
  model_path_ = o.work_dir + "/m/tiny/model.safetensors";
  CONNEX_RETURN_IF_ERROR(chaos::MakeModel(BinDir(), model_path_,
                                          {"--layers", "4", "--dim", "128", "--heads", "4",
                                           "--kv-heads", "2", "--ffn", "256", "--seed", "11"}));
  for (int m = 0; m < 3; ++m) CONNEX_RETURN_IF_ERROR(StartEtcd(m));
  // Ready once every member answers health through TLS with a client certificate.
  absl::Status health = absl::UnavailableError("not asked yet");
  if (!WaitUntil(
          [&] {
            health = Etcdctl({"endpoint", "health"}).status();
            return health.ok();
          },
          60'000, 100)) {
    return absl::UnavailableError(StrCat("etcd never healthy: ", health.message(), " (logs in ",
                                         o.work_dir, "/etcd-e*.log)"));
  }
  // Stages, last first, so that a chain is whole as soon as its stage 0 is up.
  for (uint32_t r = 0; r < kReplicas; ++r) {
    for (uint32_t s = kStages; s-- > 0;) CONNEX_RETURN_IF_ERROR(StartStage(s, r));
  }
  SubprocessOptions so;
  so.env = {"CONNEX_DIRECTORY=" + directory(),
            "CONNEX_ETCD_CA_FILE=" + pki("ca.pem"),
            "CONNEX_ETCD_CERT_FILE=" + pki("client.pem"),
            "CONNEX_ETCD_KEY_FILE=" + pki("client-key.pem"),
            StrCat("CONNEX_ETCD_ATTEMPT_TIMEOUT_MS=", o.etcd_attempt_timeout_ms),
            StrCat("CONNEX_ETCD_WATCH_PROBE_MS=", o.etcd_watch_probe_ms),
            "CONNEX_CURVE_KEY_FILE=" + pki("proxy.key"),
            "CONNEX_MODEL_NAME=tiny",
            StrCat("CONNEX_PROXY_LISTEN=", proxy().ToString()),
            StrCat("CONNEX_PROXY_IDLE_TIMEOUT_MS=", o.proxy_idle_timeout_ms),
            StrCat("CONNEX_PROXY_CONNECT_TIMEOUT_MS=", o.proxy_connect_timeout_ms),
            "CONNEX_INSECURE=1",
            "CONNEX_LOG_LEVEL=" + LogLevel()};
  CONNEX_ASSIGN_OR_RETURN(proxy_,
                          hosts_->Start(kProxyHost, "proxy", {BinDir() + "/connex-proxy"}, so));
  if (!hosts_->process(proxy_).WaitForLine("listening http=", 60'000)) {
    return absl::UnavailableError("connex-proxy never listened; see " + hosts_->log_path(proxy_));
  }
  if (!WaitUntil([&] { return Healthy(kReplicas); }, 120'000, 50)) {
    return absl::UnavailableError(
        StrCat("the deployment never became healthy; logs in ", o.work_dir));
  }
  return absl::OkStatus();
}

absl::Status MultiHostDeployment::MakePki() {
  const std::string dir = options_.work_dir + "/pki";
  std::filesystem::create_directories(dir);
  auto openssl = [](std::vector<std::string> args) {
    args.insert(args.begin(), "/usr/bin/openssl");
    return Run(args).status();
  };
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  std::vector<std::string> ca = {"req", "-x509"};
  ca.insert(ca.end(), ec.begin(), ec.end());
  ca.insert(ca.end(), {"-keyout", pki("ca-key.pem"), "-out", pki("ca.pem"), "-days", "2", "-subj",
                       "/CN=connex-hosts-test-ca"});
  CONNEX_RETURN_IF_ERROR(openssl(ca));
  // One certificate per etcd member (its host's address; server and peer-client use) and one
  // for the clients (every Connex process and etcdctl).
  auto issue = [&](const std::string& name, const std::string& san,
                   const std::string& usage) -> absl::Status {
    std::ofstream(pki(name + ".ext")) << (san.empty() ? "" : "subjectAltName=" + san + "\n")
                                      << "extendedKeyUsage=" << usage << "\n";
    std::vector<std::string> req = {"req"};
    req.insert(req.end(), ec.begin(), ec.end());
    req.insert(req.end(), {"-keyout", pki(name + "-key.pem"), "-out", pki(name + ".csr"), "-subj",
                           "/CN=" + name});
    CONNEX_RETURN_IF_ERROR(openssl(req));
    CONNEX_RETURN_IF_ERROR(
        openssl({"x509", "-req", "-in", pki(name + ".csr"), "-CA", pki("ca.pem"), "-CAkey",
                 pki("ca-key.pem"), "-CAcreateserial", "-out", pki(name + ".pem"), "-days", "2",
                 "-extfile", pki(name + ".ext")}));
    chmod(pki(name + "-key.pem").c_str(), 0600);
    return absl::OkStatus();
  };
  for (int m = 0; m < 3; ++m) {
    CONNEX_RETURN_IF_ERROR(issue(StrCat("e", m + 1),
                                 StrCat("IP:", hosts_->address(m + 1), ",IP:127.0.0.1"),
                                 "serverAuth,clientAuth"));
  }
  CONNEX_RETURN_IF_ERROR(issue("client", "", "clientAuth"));
  // A CURVE key pair per process; the stages admit each other's keys (and nobody else's).
  std::string authorized;
  std::vector<std::string> names = {"proxy"};
  for (uint32_t r = 0; r < kReplicas; ++r) {
    for (uint32_t s = 0; s < kStages; ++s) names.push_back(StrCat("stage-", s, "-", r));
  }
  for (const std::string& n : names) {
    CONNEX_ASSIGN_OR_RETURN(std::string out,
                            Run({BinDir() + "/connexctl", "keygen", "--out", pki(n)}));
    std::smatch m;
    if (!std::regex_search(out, m, std::regex("public key ([^\\s]+)"))) {
      return absl::InternalError("connexctl keygen printed no public key: " + out);
    }
    authorized += StrCat("# ", n, "\n", std::string(m[1]), "\n");
  }
  std::ofstream(pki("authorized.keys")) << authorized;
  return absl::OkStatus();
}

absl::Status MultiHostDeployment::StartEtcd(int member) {
  const int host = member + 1;
  const std::string name = StrCat("e", member + 1), addr = hosts_->address(host);
  std::string cluster;
  for (int m = 0; m < 3; ++m) {
    cluster += StrCat(m ? "," : "", "e", m + 1, "=https://", hosts_->address(m + 1), ":2380");
  }
  const std::string data = StrCat(options_.work_dir, "/etcd-", name);
  std::vector<std::string> argv = {
      "/usr/bin/etcd", "--name", name, "--data-dir", data, "--listen-client-urls",
      StrCat("https://", addr, ":2379"), "--advertise-client-urls",
      StrCat("https://", addr, ":2379"), "--listen-peer-urls", StrCat("https://", addr, ":2380"),
      "--initial-advertise-peer-urls", StrCat("https://", addr, ":2380"), "--initial-cluster",
      cluster, "--initial-cluster-state", "new", "--initial-cluster-token",
      StrCat("connex-hosts-", getpid()), "--cert-file", pki(name + ".pem"), "--key-file",
      pki(name + "-key.pem"), "--trusted-ca-file", pki("ca.pem"), "--client-cert-auth",
      "--peer-cert-file", pki(name + ".pem"), "--peer-key-file", pki(name + "-key.pem"),
      "--peer-trusted-ca-file", pki("ca.pem"), "--peer-client-cert-auth",
      // A dead leader is replaced within about half a second (docs/deploy.md).
      "--heartbeat-interval", "50", "--election-timeout", "500", "--pre-vote", "--logger", "zap",
      "--log-level", "warn"};
  SubprocessOptions so;
  so.stderr_path = StrCat(options_.work_dir, "/etcd-", name, ".log");
  CONNEX_ASSIGN_OR_RETURN(int h, hosts_->Start(host, "etcd-" + name, argv, so));
  etcd_.push_back(h);
  return absl::OkStatus();
}

absl::Status MultiHostDeployment::StartStage(uint32_t stage, uint32_t replica) {
  const MultiHostOptions& o = options_;
  const int host = HostOf(stage, replica);
  const std::string addr = hosts_->address(host);
  SubprocessOptions so;
  so.env = {
      "CONNEX_DIRECTORY=" + directory(), "CONNEX_ETCD_CA_FILE=" + pki("ca.pem"),
      "CONNEX_ETCD_CERT_FILE=" + pki("client.pem"), "CONNEX_ETCD_KEY_FILE=" + pki("client-key.pem"),
      StrCat("CONNEX_ETCD_ATTEMPT_TIMEOUT_MS=", o.etcd_attempt_timeout_ms),
      StrCat("CONNEX_ETCD_WATCH_PROBE_MS=", o.etcd_watch_probe_ms),
      "CONNEX_CURVE_KEY_FILE=" + pki(StrCat("stage-", stage, "-", replica, ".key")),
      "CONNEX_CURVE_AUTHORIZED_KEYS_FILE=" + pki("authorized.keys"), "CONNEX_MODEL=" + model_path_,
      "CONNEX_MODEL_NAME=tiny", StrCat("CONNEX_STAGES=", kStages), StrCat("CONNEX_STAGE=", stage),
      StrCat("CONNEX_REPLICA=", replica), "CONNEX_SIGNAL_HOST=" + addr,
      "CONNEX_TRANSPORT_HOST=" + addr,
      // tcp between hosts, shm within one (each host has a host name of its own).
      "CONNEX_PP_BACKEND=auto", "CONNEX_TRANSPORT_AUTO_BACKENDS=shm,tcp", "CONNEX_INSECURE=1",
      "CONNEX_ENGINE_THREADS=1", "CONNEX_LOG_LEVEL=" + LogLevel(),
      StrCat("CONNEX_LEASE_TTL_MS=", o.lease_ttl_ms),
      StrCat("CONNEX_PP_STEP_TIMEOUT_MS=", o.step_timeout_ms),
      StrCat("CONNEX_PP_PROBE_TIMEOUT_MS=", o.probe_timeout_ms)};
  so.env.push_back(stage == 0 ? "CONNEX_HTTP=" + api(replica).ToString()
                              : "CONNEX_METRICS_LISTEN=" + metrics(stage, replica).ToString());
  const std::string name = StrCat("stage-", stage, "-r", replica);
  CONNEX_ASSIGN_OR_RETURN(int h, hosts_->Start(host, name, {BinDir() + "/connex-stage"}, so));
  stages_[{stage, replica}] = h;
  if (!hosts_->process(h).WaitForLine("ready ", 60'000)) {
    return absl::UnavailableError(
        StrCat(name, " on host ", host, " never said ready; see ", hosts_->log_path(h)));
  }
  return absl::OkStatus();
}

bool MultiHostDeployment::Healthy(uint32_t replicas) {
  absl::StatusOr<chaos::HttpReply> m = chaos::HttpGet(proxy(), "/metrics", 2000);
  if (!m.ok() || m->status != 200) return false;
  auto parsed = chaos::ParseMetrics(m->body);
  auto it = parsed.find("connex_proxy_replicas");
  if (it == parsed.end() || it->second < replicas) return false;
  for (uint32_t r = 0; r < kReplicas; ++r) {
    if (!hosts_->running(handle(0, r))) continue;
    absl::StatusOr<chaos::HttpReply> h = chaos::HttpGet(api(r), "/health", 2000);
    if (!h.ok() || h->status != 200) return false;
  }
  return true;
}

absl::StatusOr<std::string> MultiHostDeployment::Etcdctl(const std::vector<std::string>& args) {
  std::string endpoints;
  for (int m = 0; m < 3; ++m) {
    endpoints += StrCat(m ? "," : "", "https://", hosts_->address(m + 1), ":2379");
  }
  std::vector<std::string> argv = {"/usr/bin/etcdctl",
                                   "--endpoints=" + endpoints,
                                   "--cacert=" + pki("ca.pem"),
                                   "--cert=" + pki("client.pem"),
                                   "--key=" + pki("client-key.pem"),
                                   "--dial-timeout=1s",
                                   "--command-timeout=3s"};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv, {"ETCDCTL_API=3"});
}

absl::StatusOr<int> MultiHostDeployment::EtcdLeaderHost(int skip_host) {
  // Each member's status on its own: a dead member's endpoint fails and is skipped.
  for (int m = 0; m < 3; ++m) {
    if (m + 1 == skip_host) continue;
    std::vector<std::string> argv = {
        "/usr/bin/etcdctl",
        StrCat("--endpoints=https://", hosts_->address(m + 1), ":2379"),
        "--cacert=" + pki("ca.pem"),
        "--cert=" + pki("client.pem"),
        "--key=" + pki("client-key.pem"),
        "--dial-timeout=1s",
        "--command-timeout=2s",
        "endpoint",
        "status",
        "-w",
        "json"};
    absl::StatusOr<std::string> out = Run(argv, {"ETCDCTL_API=3"});
    if (!out.ok()) continue;
    std::optional<std::pair<uint64_t, uint64_t>> ids = LeaderAndSelf(*out);
    if (ids && ids->first == ids->second) return m + 1;
  }
  return absl::UnavailableError("no etcd member says it leads");
}

absl::Status MultiHostDeployment::MoveEtcdLeader(int host) {
  std::vector<std::string> argv = {"/usr/bin/etcdctl",
                                   StrCat("--endpoints=https://", hosts_->address(host), ":2379"),
                                   "--cacert=" + pki("ca.pem"),
                                   "--cert=" + pki("client.pem"),
                                   "--key=" + pki("client-key.pem"),
                                   "endpoint",
                                   "status",
                                   "-w",
                                   "json"};
  CONNEX_ASSIGN_OR_RETURN(std::string out, Run(argv, {"ETCDCTL_API=3"}));
  std::optional<std::pair<uint64_t, uint64_t>> ids = LeaderAndSelf(out);
  if (!ids) return absl::InternalError("etcdctl endpoint status: " + out);
  const uint64_t id = ids->second;
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(id));
  return Etcdctl({"move-leader", hex}).status();
}

absl::StatusOr<uint64_t> MultiHostDeployment::DirectoryEpoch(uint32_t stage, uint32_t replica) {
  CONNEX_ASSIGN_OR_RETURN(
      std::string out,
      Run({BinDir() + "/connexctl", "--directory", directory(), "resolve", "tiny", StrCat(stage)},
          {"CONNEX_ETCD_CA_FILE=" + pki("ca.pem"), "CONNEX_ETCD_CERT_FILE=" + pki("client.pem"),
           "CONNEX_ETCD_KEY_FILE=" + pki("client-key.pem")}));
  std::smatch m;
  const std::string lid = StrCat("tiny/g", stage, "/s0/r", replica, " epoch=([0-9]+)");
  if (!std::regex_search(out, m, std::regex(lid))) return 0;
  return std::stoull(m[1]);
}

absl::StatusOr<std::map<std::string, double>> MultiHostDeployment::Metrics(uint32_t stage,
                                                                           uint32_t replica) {
  CONNEX_ASSIGN_OR_RETURN(chaos::HttpReply r,
                          chaos::HttpGet(metrics(stage, replica), "/metrics", 3000));
  if (r.status != 200) {
    return absl::UnavailableError(
        StrCat("/metrics of stage ", stage, "/r", replica, ": ", r.status));
  }
  return chaos::ParseMetrics(r.body);
}

}  // namespace connex::testing
