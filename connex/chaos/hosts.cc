#include "connex/chaos/hosts.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/chaos/cluster.h"

namespace connex::chaos {
namespace {

constexpr char kNamePrefix[] = "cxh";
constexpr int kDelayQueue = 7;  // the NFQUEUE number inside every host (each has its own)

std::string FindTool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    std::string p = dir + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Runs `argv` (argv[0] a path) in `netns` (empty: here) to completion.
absl::StatusOr<std::string> RunTool(const std::vector<std::string>& argv,
                                    const std::string& netns) {
  SubprocessOptions so;
  so.capture_stderr = true;
  so.netns = netns;
  std::string error;
  std::optional<Subprocess> p = Subprocess::Start(argv, so, &error);
  if (!p) return absl::InternalError(StrCat(argv[0], ": ", error));
  while (p->ReadLine(20'000)) {
  }
  std::optional<int> code = p->Wait(20'000);
  if (code != 0) {
    std::string cmd;
    for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return absl::FailedPreconditionError(
        StrCat(netns.empty() ? "" : "in " + netns + ": ", cmd, ": ",
               p->transcript().empty() ? "failed" : p->transcript()));
  }
  return p->transcript();
}

// Lines of `ip -o link` / `ip netns list`: the first word of each (link names lose "@peer").
std::vector<std::string> Names(const std::vector<std::string>& ip_args, bool link) {
  absl::StatusOr<std::string> out = RunTool(ip_args, "");
  std::vector<std::string> names;
  if (!out.ok()) return names;
  std::istringstream in(*out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string w;
    if (link) words >> w;  // "12:"
    words >> w;
    if (!w.empty() && w.back() == ':') w.pop_back();
    if (size_t at = w.find('@'); at != std::string::npos) w.resize(at);
    names.push_back(w);
  }
  return names;
}

// The pid in "cxh<pid>..." when it names a process that is gone; 0 otherwise.
bool LeftOver(const std::string& name) {
  if (name.rfind(kNamePrefix, 0) != 0) return false;
  size_t at = sizeof(kNamePrefix) - 1, end = at;
  while (end < name.size() && isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == at) return false;
  const int pid = std::stoi(name.substr(at, end - at));
  return pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH;
}

void RemoveLeftovers() {
  const std::string ip = FindTool("ip");
  for (const std::string& l : Names({ip, "-o", "link", "show"}, true)) {
    if (LeftOver(l)) (void)RunTool({ip, "link", "del", l}, "");
  }
  for (const std::string& n : Names({ip, "netns", "list"}, false)) {
    if (LeftOver(n)) (void)RunTool({ip, "netns", "del", n}, "");
  }
}

}  // namespace

absl::Status Hosts::Available() {
  CONNEX_RETURN_IF_ERROR(NetnsAvailable());
  if (FindTool("iptables").empty()) {
    return absl::FailedPreconditionError(
        "iptables is not installed (scripts/install-deps.sh installs Debian's iptables)");
  }
  if (FindTool("tc").empty()) return absl::FailedPreconditionError("tc (iproute2) is missing");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Hosts>> Hosts::Make(HostsOptions options) {
  if (options.hosts < 1 || options.hosts > 200) {
    return absl::InvalidArgumentError(StrCat("hosts: ", options.hosts, " is not in 1 .. 200"));
  }
  CONNEX_RETURN_IF_ERROR(Available());
  RemoveLeftovers();
  if (options.subnet < 0) {
    // From the process id, skipping a subnet another live run holds (its bridge's address).
    absl::StatusOr<std::string> addrs = RunTool({FindTool("ip"), "-4", "-o", "addr", "show"}, "");
    const int first = static_cast<int>(getpid() % 250);
    for (int i = 0; i < 250; ++i) {
      options.subnet = (first + i) % 250 + 1;
      if (!addrs.ok() ||
          addrs->find(StrCat(" 10.77.", options.subnet, ".1/")) == std::string::npos) {
        break;
      }
    }
  }
  if (options.subnet > 254) {
    return absl::InvalidArgumentError(StrCat("hosts: subnet ", options.subnet, " of 10.77.S.0"));
  }
  if (options.netdelay.empty()) options.netdelay = BinDir() + "/connex-netdelay";
  std::unique_ptr<Hosts> h(new Hosts(std::move(options)));
  h->prefix_ = StrCat(kNamePrefix, getpid());
  h->delayers_.assign(h->options_.hosts, -1);
  h->loss_.assign(h->options_.hosts, 0);
  CONNEX_RETURN_IF_ERROR(h->MakeNetwork());  // the destructor removes what was made
  return h;
}

std::string Hosts::address(int host) const {
  return StrCat("10.77.", options_.subnet, ".", 10 + host);
}
std::string Hosts::bridge_address() const { return StrCat("10.77.", options_.subnet, ".1"); }
std::string Hosts::subnet() const { return StrCat("10.77.", options_.subnet, ".0/24"); }
std::string Hosts::netns(int host) const { return StrCat(prefix_, "n", host); }
std::string Hosts::link(int host) const { return StrCat(prefix_, "v", host); }

absl::Status Hosts::MakeNetwork() {
  const std::string bridge = prefix_ + "b";
  CONNEX_RETURN_IF_ERROR(RunIp({"link", "add", bridge, "type", "bridge"}));
  CONNEX_RETURN_IF_ERROR(RunIp({"addr", "add", bridge_address() + "/24", "dev", bridge}));
  CONNEX_RETURN_IF_ERROR(RunIp({"link", "set", bridge, "up"}));
  for (int i = 0; i < options_.hosts; ++i) {
    const std::string ns = netns(i), peer = StrCat(prefix_, "p", i);
    CONNEX_RETURN_IF_ERROR(RunIp({"netns", "add", ns}));
    CONNEX_RETURN_IF_ERROR(RunIp({"link", "add", link(i), "type", "veth", "peer", "name", peer}));
    CONNEX_RETURN_IF_ERROR(RunIp({"link", "set", peer, "netns", ns}));
    CONNEX_RETURN_IF_ERROR(RunIp({"-n", ns, "link", "set", peer, "name", "eth0"}));
    CONNEX_RETURN_IF_ERROR(RunIp({"link", "set", link(i), "master", bridge}));
    CONNEX_RETURN_IF_ERROR(RunIp({"link", "set", link(i), "up"}));
    CONNEX_RETURN_IF_ERROR(RunIp({"-n", ns, "addr", "add", address(i) + "/24", "dev", "eth0"}));
    CONNEX_RETURN_IF_ERROR(RunIp({"-n", ns, "link", "set", "eth0", "up"}));
    CONNEX_RETURN_IF_ERROR(RunIp({"-n", ns, "link", "set", "lo", "up"}));
  }
  return absl::OkStatus();
}

Hosts::~Hosts() {
  for (Proc& p : procs_) {
    if (p.process) p.process->Signal(SIGCONT);
    p.process.reset();  // SIGKILL and reap
  }
  for (int i = 0; i < options_.hosts; ++i) {
    (void)RunIp({"link", "del", link(i)});
    (void)RunIp({"netns", "del", netns(i)});
  }
  (void)RunIp({"link", "del", prefix_ + "b"});
}

absl::StatusOr<int> Hosts::Start(int host, const std::string& name,
                                 const std::vector<std::string>& argv, SubprocessOptions options) {
  if (host < 0 || host >= size()) return absl::InvalidArgumentError(StrCat("no host ", host));
  options.netns = netns(host);
  // A host name of its own, too: what tells same-host peers (shm) from the others.
  options.hostname = netns(host);
  Proc p;
  p.host = host;
  p.name = name;
  if (!options.capture_stderr && options.stderr_path.empty()) {
    options.stderr_path = StrCat(options_.work_dir, "/", name, ".log");
  }
  p.log = options.stderr_path;
  std::string error;
  p.process = Subprocess::Start(argv, options, &error);
  if (!p.process) return absl::InternalError(StrCat(name, " on host ", host, ": ", error));
  procs_.push_back(std::move(p));
  return static_cast<int>(procs_.size()) - 1;
}

Subprocess& Hosts::process(int handle) { return *procs_.at(handle).process; }

bool Hosts::running(int handle) {
  Proc& p = procs_.at(handle);
  return p.process && !p.process->Exited();
}

void Hosts::Kill(int handle) {
  Proc& p = procs_.at(handle);
  if (!p.process) return;
  p.process->Signal(SIGCONT);
  p.process->Signal(SIGKILL);
  p.process->Wait(10'000);
}

absl::StatusOr<std::string> Hosts::Exec(int host, const std::vector<std::string>& argv) {
  if (host < 0 || host >= size()) return absl::InvalidArgumentError(StrCat("no host ", host));
  std::vector<std::string> a = argv;
  if (!a.empty() && a[0].find('/') == std::string::npos) {
    const std::string path = FindTool(a[0]);
    if (!path.empty()) a[0] = path;
  }
  return RunTool(a, netns(host));
}

absl::Status Hosts::Iptables(int host, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"iptables", "-w", "5"};
  argv.insert(argv.end(), args.begin(), args.end());
  return Exec(host, argv).status();
}

absl::Status Hosts::SetLoss(int host, double probability) {
  if (probability < 0 || probability >= 1) {
    return absl::InvalidArgumentError(StrCat("loss ", probability, " is not in [0, 1)"));
  }
  // Only what comes over the link (eth0): the host's own loopback keeps every packet.
  auto rule = [](double p) {
    return std::vector<std::string>{"INPUT",     "-i",     "eth0",   "-m",
                                    "statistic", "--mode", "random", "--probability",
                                    StrCat(p),   "-j",     "DROP"};
  };
  if (loss_[host] > 0) {
    std::vector<std::string> del = {"-D"};
    for (const std::string& w : rule(loss_[host])) del.push_back(w);
    CONNEX_RETURN_IF_ERROR(Iptables(host, del));
    loss_[host] = 0;
  }
  if (probability > 0) {
    std::vector<std::string> add = {"-A"};
    for (const std::string& w : rule(probability)) add.push_back(w);
    CONNEX_RETURN_IF_ERROR(Iptables(host, add));
    loss_[host] = probability;
  }
  return absl::OkStatus();
}

absl::Status Hosts::SetRate(int host, int64_t bits_per_second) {
  (void)Exec(host, {"tc", "qdisc", "del", "dev", "eth0", "root"});  // none: nothing to clear
  if (bits_per_second <= 0) return absl::OkStatus();
  // A bucket of 10 ms at the rate (at least 16 KiB) and 50 ms of queue before tbf drops.
  const int64_t burst = std::max<int64_t>(16 * 1024, bits_per_second / 8 / 100);
  return Exec(host, {"tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                     StrCat(bits_per_second, "bit"), "burst", StrCat(burst), "latency", "50ms"})
      .status();
}

absl::Status Hosts::SetDelay(int host, int64_t delay_us) {
  // Every packet the host sends to another host (never its loopback) goes through the queue.
  const std::vector<std::string> rule = {
      "OUTPUT", "-o", "eth0", "-d", subnet(), "-j", "NFQUEUE", "--queue-num", StrCat(kDelayQueue)};
  if (int d = delayers_[host]; d >= 0) {
    std::vector<std::string> del = {"-D"};
    del.insert(del.end(), rule.begin(), rule.end());
    CONNEX_RETURN_IF_ERROR(Iptables(host, del));
    Kill(d);  // after the rule: no packet is left waiting for a verdict that never comes
    delayers_[host] = -1;
  }
  if (delay_us <= 0) return absl::OkStatus();
  if (access(options_.netdelay.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        StrCat(options_.netdelay,
               " is missing (it is built when libnetfilter-queue-dev is "
               "installed: scripts/install-deps.sh)"));
  }
  CONNEX_ASSIGN_OR_RETURN(int d, Start(host, StrCat("netdelay-h", host),
                                       {options_.netdelay, "--queue", StrCat(kDelayQueue),
                                        "--delay-us", StrCat(delay_us)}));
  if (!process(d).WaitForLine("ready", 10'000)) {
    Kill(d);
    return absl::UnavailableError(
        StrCat("connex-netdelay on host ", host, " never said ready; see ", log_path(d)));
  }
  std::vector<std::string> add = {"-A"};
  add.insert(add.end(), rule.begin(), rule.end());
  if (absl::Status s = Iptables(host, add); !s.ok()) {
    Kill(d);
    return s;
  }
  delayers_[host] = d;
  return absl::OkStatus();
}

absl::Status Hosts::Lose(int host) {
  // As a power cut: the link first, so that nothing the dying processes send (a FIN, a RST, a
  // last message) reaches anyone; then every process of the namespace, ours or not, and ours
  // reaped.
  CONNEX_RETURN_IF_ERROR(Cut(host));
  absl::StatusOr<std::string> pids = RunTool({FindTool("ip"), "netns", "pids", netns(host)}, "");
  if (pids.ok()) {
    std::istringstream in(*pids);
    int pid = 0;
    while (in >> pid) kill(pid, SIGKILL);
  }
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (procs_[i].host == host) Kill(static_cast<int>(i));
  }
  delayers_[host] = -1;
  return absl::OkStatus();
}

absl::Status Hosts::Cut(int host) { return RunIp({"link", "set", link(host), "down"}); }
absl::Status Hosts::Heal(int host) { return RunIp({"link", "set", link(host), "up"}); }

}  // namespace connex::chaos
