// EtcdCluster: a real etcd cluster for tests — N members (the `etcd` binary of Debian's
// etcd-server) on free loopback ports, each with its own data directory, started as child
// processes that die with the test (connex/base/subprocess.h), and ready once every member knows
// a leader. Thread-compatible: one test thread drives it.
#ifndef CONNEX_DIRECTORY_ETCD_TESTING_ETCD_CLUSTER_H_
#define CONNEX_DIRECTORY_ETCD_TESTING_ETCD_CLUSTER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/subprocess.h"

namespace connex::directory::etcd::testing {

struct EtcdClusterOptions {
  int members = 3;
  // Under this directory, one data directory (removed with the cluster) and one log file per
  // member (kept).
  std::string dir;
  // How long Start waits for every member to know a leader.
  int64_t ready_timeout_ms = 60000;
  // Clients speak TLS to the members and must present a certificate of the cluster's CA
  // (--client-cert-auth); Start makes the CA and the certificates with openssl (tls_files()).
  bool tls = false;
  // etcd's --heartbeat-interval and --election-timeout (0: etcd's defaults, 100 and 1000 ms).
  // A leader's death is noticed after the election timeout: shorter, and clients go on sooner.
  int64_t heartbeat_interval_ms = 0;
  int64_t election_timeout_ms = 0;
};

// The PEM files of a TLS cluster: its CA, and a client certificate the CA signed.
struct EtcdTlsFiles {
  std::string ca_file;
  std::string client_cert_file;
  std::string client_key_file;
};

class EtcdCluster {
 public:
  // The etcd binary on PATH, or empty when etcd is not installed (tests skip then).
  static std::string FindEtcd();
  // `name` on PATH (a full path), or empty.
  static std::string FindBinary(const std::string& name);
  // The message tests skip with when FindEtcd() is empty.
  static constexpr char kSkipMessage[] =
      "etcd is not installed (no `etcd` on PATH): scripts/install-deps.sh installs etcd-server";

  // Starts the members and waits until each one answers Status and knows a leader.
  // FailedPrecondition: no etcd binary; Unavailable: the cluster did not come up (the message
  // carries the members' logs).
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(const EtcdClusterOptions& options);
  ~EtcdCluster();  // SIGKILLs every member still running and removes the data directories

  // etcd://127.0.0.1:P1,... — every member, in order.
  std::string address() const;
  // One member's client endpoint (127.0.0.1:PORT), and the index of an endpoint (-1: none).
  std::string client_endpoint(int index) const;
  int IndexOf(const std::string& endpoint) const;
  int size() const { return static_cast<int>(members_.size()); }
  const EtcdTlsFiles& tls_files() const { return tls_; }

  // SIGKILLs member `index` and reaps it (its data directory stays, for Restart).
  void Kill(int index);
  // Sends `signal` to member `index` (SIGSTOP, SIGCONT, ...).
  void Signal(int index, int signal);
  // Starts a killed member again on its ports and data directory.
  absl::Status Restart(int index);
  bool running(int index);
  // Whether member `index` is stopped (SIGSTOP) now, from /proc/PID/stat.
  bool stopped(int index);

  // Runs etcdctl (etcd-client) with `args` against every member; returns its output, or
  // FailedPrecondition (no etcdctl) / Internal (it failed, with its output).
  absl::StatusOr<std::string> Etcdctl(const std::vector<std::string>& args);

  // The index of the member that is leader, as the live members report it.
  absl::StatusOr<int> Leader();
  // Every member's log (the last `bytes` of each), for failure messages.
  std::string Logs(size_t bytes = 4000) const;

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    int metrics_port = 0;  // plain HTTP /health, whatever the client URLs speak
    std::string data_dir;
    std::string log_path;
    std::optional<Subprocess> process;
  };
  EtcdCluster() = default;
  absl::Status StartMember(int index, bool existing);
  absl::Status WaitReady(int64_t timeout_ms);
  absl::Status MakeCertificates(const std::string& dir);

  std::string etcd_;
  std::string token_;
  bool use_tls_ = false;
  std::vector<std::string> tuning_;  // --heartbeat-interval, --election-timeout
  EtcdTlsFiles tls_;
  std::string server_cert_file_;
  std::string server_key_file_;
  std::vector<Member> members_;
};

}  // namespace connex::directory::etcd::testing

#endif  // CONNEX_DIRECTORY_ETCD_TESTING_ETCD_CLUSTER_H_
