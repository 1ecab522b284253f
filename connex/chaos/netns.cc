// Cluster's netns mode: every stage process in a network namespace of its own, joined to the
// others by a veth pair on one bridge, so that a stage's link can be cut while it runs; and the
// bookkeeping that removes what this process made, also after a signal.
#include <unistd.h>

#include <mutex>
#include <set>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/base/subprocess.h"
#include "connex/chaos/cluster.h"

namespace connex::chaos {
namespace {

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// What the clusters of this process made: links / bridges ("link") and namespaces ("netns").
std::mutex made_mu;
std::set<std::pair<std::string, std::string>>& Made() {
  static auto* made = new std::set<std::pair<std::string, std::string>>();
  return *made;
}
void NoteMade(const std::string& kind, const std::string& name) {
  std::lock_guard<std::mutex> lock(made_mu);
  Made().insert({kind, name});
}
void Unmake(const std::string& kind, const std::string& name) {
  (void)RunIp({kind == "netns" ? "netns" : "link", "del", name});
  std::lock_guard<std::mutex> lock(made_mu);
  Made().erase({kind, name});
}

}  // namespace

void RemoveNetworksOfThisProcess() {
  std::set<std::pair<std::string, std::string>> made;
  {
    std::lock_guard<std::mutex> lock(made_mu);
    made = Made();
  }
  // Links first (a veth pair goes with either end), then the namespaces.
  for (const auto& [kind, name] : made) {
    if (kind == "link") Unmake(kind, name);
  }
  for (const auto& [kind, name] : made) {
    if (kind == "netns") Unmake(kind, name);
  }
}

absl::Status RunIp(const std::vector<std::string>& args) {
  const std::string ip = IpBinary();
  if (ip.empty()) return absl::FailedPreconditionError("iproute2's ip is not installed");
  std::vector<std::string> argv = {ip};
  argv.insert(argv.end(), args.begin(), args.end());
  SubprocessOptions options;
  options.capture_stderr = true;
  std::string error;
  std::optional<Subprocess> p = Subprocess::Start(argv, options, &error);
  if (!p) return absl::InternalError("ip: " + error);
  while (p->ReadLine(10'000)) {
  }
  std::optional<int> code = p->Wait(10'000);
  if (code != 0) {
    std::string cmd = "ip";
    for (const std::string& a : args) cmd += " " + a;
    return absl::FailedPreconditionError(
        StrCat(cmd, ": ", p->transcript().empty() ? "failed" : p->transcript()));
  }
  return absl::OkStatus();
}

absl::Status NetnsAvailable() {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError("network namespaces need root (this is uid " +
                                         std::to_string(geteuid()) + ")");
  }
  if (IpBinary().empty()) return absl::FailedPreconditionError("iproute2's ip is not installed");
  // Really make one, with a veth pair and a bridge, then remove them.
  const std::string p = "cxq" + std::to_string(getpid() % 100000);
  absl::Status s = RunIp({"netns", "add", p + "n"});
  if (s.ok()) s = RunIp({"link", "add", p + "b", "type", "bridge"});
  if (s.ok()) s = RunIp({"link", "add", p + "h", "type", "veth", "peer", "name", p + "p"});
  if (s.ok()) s = RunIp({"link", "set", p + "p", "netns", p + "n"});
  (void)RunIp({"link", "del", p + "h"});
  (void)RunIp({"link", "del", p + "b"});
  (void)RunIp({"netns", "del", p + "n"});
  return s;
}

std::string Cluster::StageHost(uint32_t stage, uint32_t replica) const {
  if (!options_.netns) return "127.0.0.1";
  return StrCat("10.231.", subnet_, ".", 10 + replica * options_.stages + stage);
}
std::string Cluster::NetnsName(uint32_t stage, uint32_t replica) const {
  return StrCat(net_prefix_, "n", replica * options_.stages + stage);
}
std::string Cluster::LinkName(uint32_t stage, uint32_t replica) const {
  return StrCat(net_prefix_, "h", replica * options_.stages + stage);
}

absl::Status Cluster::MakeNetwork() {
  if (options_.replicas * options_.stages > 240) {
    return absl::InvalidArgumentError("netns mode: at most 240 stage processes");
  }
  net_prefix_ = "cx" + std::to_string(getpid() % 100000);
  subnet_ = static_cast<int>(getpid() % 250) + 1;
  host_ = StrCat("10.231.", subnet_, ".1");
  network_made_ = true;  // from here on, the destructor removes whatever was made
  const std::string bridge = net_prefix_ + "br";
  CONNEX_RETURN_IF_ERROR(RunIp({"link", "add", bridge, "type", "bridge"}));
  NoteMade("link", bridge);
  CONNEX_RETURN_IF_ERROR(RunIp({"addr", "add", host_ + "/24", "dev", bridge}));
  CONNEX_RETURN_IF_ERROR(RunIp({"link", "set", bridge, "up"}));
  for (uint32_t r = 0; r < options_.replicas; ++r) {
    for (uint32_t s = 0; s < options_.stages; ++s) {
      const std::string ns = NetnsName(s, r), link = LinkName(s, r);
      const std::string peer = StrCat(net_prefix_, "p", r * options_.stages + s);
      CONNEX_RETURN_IF_ERROR(RunIp({"netns", "add", ns}));
      NoteMade("netns", ns);
      CONNEX_RETURN_IF_ERROR(RunIp({"link", "add", link, "type", "veth", "peer", "name", peer}));
      NoteMade("link", link);
      CONNEX_RETURN_IF_ERROR(RunIp({"link", "set", peer, "netns", ns}));
      CONNEX_RETURN_IF_ERROR(RunIp({"link", "set", link, "master", bridge}));
      CONNEX_RETURN_IF_ERROR(RunIp({"link", "set", link, "up"}));
      CONNEX_RETURN_IF_ERROR(
          RunIp({"-n", ns, "addr", "add", StageHost(s, r) + "/24", "dev", peer}));
      CONNEX_RETURN_IF_ERROR(RunIp({"-n", ns, "link", "set", peer, "up"}));
      CONNEX_RETURN_IF_ERROR(RunIp({"-n", ns, "link", "set", "lo", "up"}));
    }
  }
  return absl::OkStatus();
}

void Cluster::RemoveNetwork() {
  if (!network_made_) return;
  network_made_ = false;
  RemoveNetworksOfThisProcess();
}

absl::Status Cluster::Partition(uint32_t stage, uint32_t replica) {
  if (!options_.netns) return absl::FailedPreconditionError("partition needs netns mode");
  return RunIp({"link", "set", LinkName(stage, replica), "down"});
}

absl::Status Cluster::Heal(uint32_t stage, uint32_t replica) {
  if (!options_.netns) return absl::FailedPreconditionError("partition needs netns mode");
  return RunIp({"link", "set", LinkName(stage, replica), "up"});
}

}  // namespace connex::chaos
