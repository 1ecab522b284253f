// A serving deployment across four namespace hosts (connex/chaos/hosts.h), as an operator would
// run it on four machines:
//   host 0: connex-proxy (alone, the clients' entry)
//   host 1: etcd member e1, stage 0 of chain 0, stage 1 of chain 1
//   host 2: etcd member e2, stage 1 of chain 0, stage 0 of chain 1
//   host 3: etcd member e3
// The directory is that 3-member etcd, TLS on client and peer URLs with client certificates
// (a CA and certificates made here with openssl); every process has a CURVE key pair of its own
// (`connexctl keygen`, mode 600; the stages' authorized keys list them all); the data plane is
// tcp between hosts. No host holds a whole chain, so losing host 1 or 2 takes one stage of each.
// Thread-compatible: one test thread drives it.
#ifndef CONNEX_TESTS_MULTIHOST_DEPLOYMENT_H_
#define CONNEX_TESTS_MULTIHOST_DEPLOYMENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/chaos/hosts.h"
#include "connex/chaos/http_client.h"

namespace connex::testing {

struct MultiHostOptions {
  std::string work_dir;  // must exist
  // The stages' failure detection: a step without its result this long is probed, a probe this
  // long unanswered means dead; their etcd lease (etcd counts whole seconds).
  int64_t step_timeout_ms = 500;
  int64_t probe_timeout_ms = 200;
  int64_t lease_ttl_ms = 2000;
  // Every process's etcd client: a call's wait on one member, a quiet watch's progress probe
  // (CONNEX_ETCD_ATTEMPT_TIMEOUT_MS, CONNEX_ETCD_WATCH_PROBE_MS) — how soon a lost member is left.
  int64_t etcd_attempt_timeout_ms = 250;
  int64_t etcd_watch_probe_ms = 250;
  // A stage 0 that sends nothing this long within a response is taken as dead by the proxy.
  int64_t proxy_idle_timeout_ms = 1000;
  // Connecting to a stage 0 may take this long (a lost host answers no SYN: the proxy's default
  // 2 s would be the whole of its outage).
  int64_t proxy_connect_timeout_ms = 300;
};

class MultiHostDeployment {
 public:
  static constexpr int kProxyHost = 0;
  static constexpr int kHosts = 4;
  static constexpr uint32_t kStages = 2, kReplicas = 2;

  // Makes the hosts, the certificates and keys, the model; starts etcd, the stages and the
  // proxy, and waits until the proxy sees both chains healthy. Errors name what failed and its
  // log; nothing is left.
  static absl::StatusOr<std::unique_ptr<MultiHostDeployment>> Start(MultiHostOptions options);

  chaos::Hosts& hosts() { return *hosts_; }
  chaos::HostPort proxy() const;
  chaos::HostPort api(uint32_t replica) const;  // stage 0 of the chain
  chaos::HostPort metrics(uint32_t stage, uint32_t replica) const;
  static int HostOf(uint32_t stage, uint32_t replica);  // where the layout puts it
  int handle(uint32_t stage, uint32_t replica) const { return stages_.at({stage, replica}); }
  const std::string& model_path() const { return model_path_; }
  // etcd://ADDR1:2379,... (every member).
  std::string directory() const;

  // etcdctl against every member, with the client certificate; its output.
  absl::StatusOr<std::string> Etcdctl(const std::vector<std::string>& args);
  // The host of the member that leads now, asked of each member but the one on `skip_host`
  // (a lost host's member would cost a dial timeout).
  absl::StatusOr<int> EtcdLeaderHost(int skip_host = -1);
  // Makes the member on `host` the leader (etcdctl move-leader).
  absl::Status MoveEtcdLeader(int host);
  // The epoch (etcd revision of its JOIN) the directory shows for a stage now; 0: no record.
  absl::StatusOr<uint64_t> DirectoryEpoch(uint32_t stage, uint32_t replica);
  // The stage's /metrics as name{labels} -> value.
  absl::StatusOr<std::map<std::string, double>> Metrics(uint32_t stage, uint32_t replica);
  // Whether the proxy's /metrics show `replicas` stage-0 replicas and both chains answer /health.
  bool Healthy(uint32_t replicas);

 private:
  explicit MultiHostDeployment(MultiHostOptions options) : options_(std::move(options)) {}
  absl::Status StartAll();
  absl::Status MakePki();
  absl::Status StartEtcd(int member);
  absl::Status StartStage(uint32_t stage, uint32_t replica);
  std::string pki(const std::string& file) const { return options_.work_dir + "/pki/" + file; }

  MultiHostOptions options_;
  std::unique_ptr<chaos::Hosts> hosts_;
  std::string model_path_;
  std::map<std::pair<uint32_t, uint32_t>, int> stages_;  // (stage, replica) -> handle
  std::vector<int> etcd_;                                // member i (host i + 1) -> handle
  int proxy_ = -1;
};

}  // namespace connex::testing

#endif  // CONNEX_TESTS_MULTIHOST_DEPLOYMENT_H_
