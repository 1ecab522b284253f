#include "connex/directory/etcd/testing/etcd_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/wait.h"
#include "connex/directory/etcd/etcd_client.h"

namespace connex::directory::etcd::testing {
namespace {

// Free loopback TCP ports, `count` distinct ones: each socket stays bound until all are picked.
absl::StatusOr<std::vector<int>> FreePorts(int count) {
  std::vector<int> fds;
  std::vector<int> ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::UnavailableError(StrCat("no free loopback port: ", std::strerror(errno)));
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  CONNEX_RETURN_IF_ERROR(status);
  return ports;
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  return all.size() > bytes ? "..." + all.substr(all.size() - bytes) : all;
}

// The body of `GET path` on 127.0.0.1:port, or the error, within about a second.
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  timeval timeout{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    out = StrCat("connect: ", std::strerror(errno));
  } else {
    std::string request = StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      out = StrCat("send: ", std::strerror(errno));
    } else {
      char buffer[4096];
      ssize_t n;
      while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) out.append(buffer, n);
      size_t body = out.find("\r\n\r\n");
      if (body != std::string::npos) out = out.substr(body + 4);
    }
  }
  close(fd);
  return out;
}

}  // namespace

std::string EtcdCluster::FindBinary(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(dirs, ':')) {
    if (dir.empty()) continue;
    std::string candidate = StrCat(AsStd(dir), "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string EtcdCluster::FindEtcd() { return FindBinary("etcd"); }

absl::StatusOr<std::string> EtcdCluster::Etcdctl(const std::vector<std::string>& args) {
  std::string etcdctl = FindBinary("etcdctl");
  if (etcdctl.empty()) {
    return absl::FailedPreconditionError(
        "etcdctl is not installed: scripts/install-deps.sh installs etcd-client");
  }
  std::string endpoints;
  for (int i = 0; i < size(); ++i) {
    if (i > 0) endpoints += ",";
    endpoints += client_endpoint(i);
  }
  std::vector<std::string> argv = {etcdctl, "--endpoints", endpoints};
  argv.insert(argv.end(), args.begin(), args.end());
  SubprocessOptions options;
  options.env = {"ETCDCTL_API=3"};
  options.capture_stderr = true;
  std::string error;
  std::optional<Subprocess> process = Subprocess::Start(argv, options, &error);
  if (!process.has_value()) return absl::InternalError(StrCat("cannot start etcdctl: ", error));
  while (process->ReadLine(30000).has_value()) {
  }
  std::optional<int> code = process->Wait(30000);
  if (code != 0) {
    return absl::InternalError(StrCat("etcdctl ", absl::StrJoin(args, " "), " exited ",
                                      code.has_value() ? std::to_string(*code) : "late", ": ",
                                      process->transcript()));
  }
  return process->transcript();
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(const EtcdClusterOptions& options) {
  static std::atomic<int> clusters{0};
  std::string etcd = FindEtcd();
  if (etcd.empty()) return absl::FailedPreconditionError(kSkipMessage);
  if (options.members < 1 || options.dir.empty()) {
    return absl::InvalidArgumentError("EtcdCluster: at least one member and a directory");
  }
  absl::Status last;
  // A port picked free can be taken by another process before etcd binds it: then a member
  // exits at once, and the whole cluster starts again on new ports.
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto cluster = std::unique_ptr<EtcdCluster>(new EtcdCluster());
    cluster->etcd_ = etcd;
    int n = clusters.fetch_add(1);
    cluster->token_ = StrCat("connex-test-", getpid(), "-", n);
    CONNEX_ASSIGN_OR_RETURN(std::vector<int> ports, FreePorts(3 * options.members));
    std::string base = StrCat(options.dir, "/etcd-", getpid(), "-", n);
    std::error_code ec;
    std::filesystem::create_directories(base, ec);
    if (ec) return absl::InternalError(StrCat("EtcdCluster: mkdir ", base, ": ", ec.message()));
    for (int i = 0; i < options.members; ++i) {
      Member member;
      member.name = StrCat("m", i);
      member.client_port = ports[3 * i];
      member.peer_port = ports[3 * i + 1];
      member.metrics_port = ports[3 * i + 2];
      member.data_dir = StrCat(base, "/", member.name, ".etcd");
      member.log_path = StrCat(base, "/", member.name, ".log");
      cluster->members_.push_back(std::move(member));
    }
    absl::Status started;
    if (options.heartbeat_interval_ms > 0) {
      cluster->tuning_.insert(cluster->tuning_.end(),
                              {"--heartbeat-interval", StrCat(options.heartbeat_interval_ms)});
    }
    if (options.election_timeout_ms > 0) {
      cluster->tuning_.insert(cluster->tuning_.end(),
                              {"--election-timeout", StrCat(options.election_timeout_ms)});
    }
    if (options.tls) {
      cluster->use_tls_ = true;
      CONNEX_RETURN_IF_ERROR(cluster->MakeCertificates(base));
    }
    for (int i = 0; i < options.members && started.ok(); ++i) {
      started = cluster->StartMember(i, /*existing=*/false);
    }
    const absl::Time begin = absl::Now();
    if (started.ok()) started = cluster->WaitReady(options.ready_timeout_ms);
    if (started.ok()) {
      CONNEX_LOG_INFO("etcd test cluster {} ready in {} ms", cluster->address(),
                      absl::ToInt64Milliseconds(absl::Now() - begin));
      return cluster;
    }
    last =
        absl::UnavailableError(StrCat("EtcdCluster: ", started.message(), "\n", cluster->Logs()));
  }
  return last;
}

EtcdCluster::~EtcdCluster() {
  // The data directories go (etcd preallocates its WAL: over 100 MB a member); the logs stay.
  for (Member& member : members_) {
    member.process.reset();
    std::error_code ignored;
    std::filesystem::remove_all(member.data_dir, ignored);
  }
}

absl::Status EtcdCluster::StartMember(int index, bool existing) {
  Member& member = members_[index];
  std::string initial_cluster;
  for (const Member& m : members_) {
    if (!initial_cluster.empty()) initial_cluster += ",";
    initial_cluster += StrCat(m.name, "=http://127.0.0.1:", m.peer_port);
  }
  std::string client_url = StrCat(use_tls_ ? "https" : "http", "://127.0.0.1:", member.client_port);
  std::string peer_url = StrCat("http://127.0.0.1:", member.peer_port);
  std::vector<std::string> argv = {
      etcd_,
      "--name",
      member.name,
      "--data-dir",
      member.data_dir,
      "--listen-client-urls",
      client_url,
      "--advertise-client-urls",
      client_url,
      "--listen-peer-urls",
      peer_url,
      "--initial-advertise-peer-urls",
      peer_url,
      "--initial-cluster",
      initial_cluster,
      "--initial-cluster-state",
      existing ? "existing" : "new",
      "--initial-cluster-token",
      token_,
      "--listen-metrics-urls",
      StrCat("http://127.0.0.1:", member.metrics_port),
      "--logger",
      "zap",
      "--log-level",
      "warn",
  };
  argv.insert(argv.end(), tuning_.begin(), tuning_.end());
  if (use_tls_) {
    argv.insert(argv.end(), {"--cert-file", server_cert_file_, "--key-file", server_key_file_,
                             "--trusted-ca-file", tls_.ca_file, "--client-cert-auth"});
  }
  SubprocessOptions options;
  options.stderr_path = member.log_path;
  std::string error;
  member.process = Subprocess::Start(argv, options, &error);
  if (!member.process.has_value()) {
    return absl::UnavailableError(StrCat("cannot start ", etcd_, " (", member.name, "): ", error));
  }
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitReady(int64_t timeout_ms) {
  // etcd's own /health on each metrics port (HTTP/1, answered once the member serves clients and
  // knows a leader). Not a gRPC call: a gRPC connection opened while a member is still starting
  // takes seconds to come up after the member does.
  std::string why = "not asked yet";
  bool ready = WaitUntil(
      [&] {
        for (int i = 0; i < size(); ++i) {
          if (!running(i)) {
            why = StrCat(members_[i].name, " exited");
            return true;  // give up at once; checked below
          }
          std::string answer = HttpGet(members_[i].metrics_port, "/health");
          if (answer.find("\"health\":\"true\"") == std::string::npos) {
            why = StrCat(members_[i].name, " is not healthy yet: '", answer, "'");
            return false;
          }
        }
        why.clear();
        return true;
      },
      timeout_ms, 50);
  if (ready && why.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      StrCat("the cluster was not ready within ", timeout_ms, " ms: ", why));
}

absl::Status EtcdCluster::MakeCertificates(const std::string& dir) {
  std::string openssl = FindBinary("openssl");
  if (openssl.empty()) {
    return absl::FailedPreconditionError(
        "openssl is not installed: it makes a TLS cluster's certificates");
  }
  auto run = [&](std::vector<std::string> args) -> absl::Status {
    args.insert(args.begin(), openssl);
    SubprocessOptions options;
    options.capture_stderr = true;
    std::string error;
    std::optional<Subprocess> process = Subprocess::Start(args, options, &error);
    if (!process.has_value()) return absl::InternalError(StrCat("cannot start openssl: ", error));
    while (process->ReadLine(30000).has_value()) {
    }
    if (process->Wait(30000) != 0) {
      return absl::InternalError(
          StrCat(absl::StrJoin(args, " "), " failed: ", process->transcript()));
    }
    return absl::OkStatus();
  };
  const std::string ca_key = StrCat(dir, "/ca-key.pem");
  tls_.ca_file = StrCat(dir, "/ca.pem");
  CONNEX_RETURN_IF_ERROR(
      run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", ca_key, "-out", tls_.ca_file, "-days", "2", "-subj", "/CN=connex-test-ca"}));
  // One certificate per role, signed by the CA; both name 127.0.0.1.
  auto issue = [&](const std::string& name, const std::string& usage, std::string* cert,
                   std::string* key) -> absl::Status {
    *cert = StrCat(dir, "/", name, ".pem");
    *key = StrCat(dir, "/", name, "-key.pem");
    std::string csr = StrCat(dir, "/", name, ".csr");
    std::string ext = StrCat(dir, "/", name, ".ext");
    std::ofstream(ext) << "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=" << usage << "\n";
    CONNEX_RETURN_IF_ERROR(
        run({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", *key, "-out", csr, "-subj", StrCat("/CN=", name)}));
    return run({"x509", "-req", "-in", csr, "-CA", tls_.ca_file, "-CAkey", ca_key,
                "-CAcreateserial", "-out", *cert, "-days", "2", "-extfile", ext});
  };
  CONNEX_RETURN_IF_ERROR(
      issue("server", "serverAuth,clientAuth", &server_cert_file_, &server_key_file_));
  return issue("client", "clientAuth", &tls_.client_cert_file, &tls_.client_key_file);
}

std::string EtcdCluster::address() const {
  std::string out(kEtcdScheme);
  for (int i = 0; i < size(); ++i) {
    if (i > 0) out += ",";
    out += client_endpoint(i);
  }
  return out;
}

std::string EtcdCluster::client_endpoint(int index) const {
  return StrCat("127.0.0.1:", members_[index].client_port);
}

int EtcdCluster::IndexOf(const std::string& endpoint) const {
  for (int i = 0; i < size(); ++i) {
    if (client_endpoint(i) == endpoint) return i;
  }
  return -1;
}

void EtcdCluster::Kill(int index) {
  Member& member = members_[index];
  if (!member.process.has_value()) return;
  member.process->Signal(SIGKILL);
  member.process->Wait(10000);
  member.process.reset();
}

void EtcdCluster::Signal(int index, int signal) {
  if (members_[index].process.has_value()) members_[index].process->Signal(signal);
}

absl::Status EtcdCluster::Restart(int index) {
  Kill(index);
  return StartMember(index, /*existing=*/true);
}

bool EtcdCluster::running(int index) {
  Member& member = members_[index];
  return member.process.has_value() && !member.process->Exited();
}

bool EtcdCluster::stopped(int index) {
  Member& member = members_[index];
  if (!member.process.has_value()) return false;
  std::ifstream in(StrCat("/proc/", member.process->pid(), "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // pid (comm) state ...: the state follows the last ')'.
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() &&
         (stat[paren + 2] == 'T' || stat[paren + 2] == 't');
}

absl::StatusOr<int> EtcdCluster::Leader() {
  EtcdClientOptions options;
  options.address = address();
  CONNEX_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Connect(options));
  std::vector<uint64_t> ids(size(), 0);
  uint64_t leader = 0;
  for (int i = 0; i < size(); ++i) {
    if (!running(i)) continue;
    absl::StatusOr<MemberStatus> status = client->Status(i);
    if (!status.ok()) continue;
    ids[i] = status->member_id;
    if (status->leader_id != 0) leader = status->leader_id;
  }
  for (int i = 0; i < size(); ++i) {
    if (leader != 0 && ids[i] == leader) return i;
  }
  return absl::UnavailableError("EtcdCluster: no live member reports a leader among the live ones");
}

std::string EtcdCluster::Logs(size_t bytes) const {
  std::string out;
  for (const Member& member : members_) {
    out += StrCat("--- ", member.name, " (", member.log_path, ")\n", Tail(member.log_path, bytes),
                  "\n");
  }
  return out;
}

}  // namespace connex::directory::etcd::testing
