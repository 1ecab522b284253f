// Hosts: N machines made of network namespaces on this one, for tests of a deployment across
// hosts. Each host is a namespace with its own address (10.77.S.10+i/24, S picked per run) on
// one veth link to a bridge in the root namespace, whose address (10.77.S.1) is this process's
// own: the test reaches every host directly (its HTTP clients, directory watchers and
// connex-generate run here), and no host's traffic leaves the bridge (no route, no forwarding,
// nothing else of the machine's touched). Processes run inside a host (Subprocess::netns), with
// the host's namespace name as their host name (a UTS namespace each: what tells same-host
// peers, which may use shm, from the others).
// Faults per host, on its link: loss (iptables' statistic match dropping a fraction of what the
// host receives), a rate limit (tc tbf on what it sends), latency (a delaying relay this class
// owns: connex-netdelay holds every packet the host sends to another host for a fixed time
// through an NFQUEUE — this kernel has no netem nor an EDT qdisc), the host lost whole (every
// process in it SIGKILLed, its link down) and cut off (link down, processes alive) and back.
// Everything goes with the object, and Make removes what a crashed earlier run left.
// Thread-compatible: one test thread drives it.
#ifndef CONNEX_CHAOS_HOSTS_H_
#define CONNEX_CHAOS_HOSTS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "connex/base/subprocess.h"

namespace connex::chaos {

struct HostsOptions {
  int hosts = 3;         // 1 .. 200
  std::string work_dir;  // logs of the processes started here; must exist
  // The third byte of 10.77.S.0/24 (0 .. 254); -1: one from this process's id (1 .. 250),
  // skipping those another live run uses.
  int subnet = -1;
  // connex-netdelay, for SetDelay; empty: $CONNEX_BIN_DIR's (BinDir()).
  std::string netdelay;
};

class Hosts {
 public:
  // OK when namespaces, veth pairs and bridges can be made here (root, iproute2, iptables);
  // FailedPrecondition saying what is missing otherwise (tests skip with it).
  static absl::Status Available();
  // Makes the hosts. Removes first the namespaces and links of earlier runs whose process is
  // gone (names "cxh<pid>..."). Errors name the `ip` command that failed; nothing is left.
  static absl::StatusOr<std::unique_ptr<Hosts>> Make(HostsOptions options);
  ~Hosts();  // SIGKILLs every process started here, removes the namespaces, links and bridge

  int size() const { return options_.hosts; }
  std::string address(int host) const;  // 10.77.S.(10+host)
  std::string bridge_address() const;   // 10.77.S.1, this process's address on the network
  std::string subnet() const;           // 10.77.S.0/24
  std::string netns(int host) const;    // its name under /run/netns

  // Starts `argv` inside `host`; stderr goes to work_dir/<name>.log unless `options` says
  // otherwise. Returns a handle for process().
  absl::StatusOr<int> Start(int host, const std::string& name, const std::vector<std::string>& argv,
                            SubprocessOptions options = {});
  Subprocess& process(int handle);
  bool running(int handle);
  int host_of(int handle) const { return procs_[handle].host; }
  std::string log_path(int handle) const { return procs_[handle].log; }
  // SIGKILLs and reaps one process.
  void Kill(int handle);
  // Runs `argv` inside `host` to completion; its output, or FailedPrecondition with it.
  absl::StatusOr<std::string> Exec(int host, const std::vector<std::string>& argv);

  // Link faults of `host` (0 clears each). Loss: the fraction of packets it receives that are
  // dropped. Rate: what it sends, in bits per second. Delay: every packet it sends to another
  // host is held `delay_us` (set it on both ends of a path: an RTT gains twice the delay).
  absl::Status SetLoss(int host, double probability);
  absl::Status SetRate(int host, int64_t bits_per_second);
  absl::Status SetDelay(int host, int64_t delay_us);
  // The host lost whole, as by a power cut: its link down first (nothing its processes send on
  // their way out gets anywhere), then every process in its namespace SIGKILLed (those started
  // here reaped). Heal brings the link back (the processes stay dead).
  absl::Status Lose(int host);
  // Cut off: its link down, its processes alive. Heal: up again.
  absl::Status Cut(int host);
  absl::Status Heal(int host);

 private:
  struct Proc {
    int host = 0;
    std::string name;
    std::string log;
    std::optional<Subprocess> process;
  };
  explicit Hosts(HostsOptions options) : options_(std::move(options)) {}
  absl::Status MakeNetwork();
  std::string link(int host) const;  // the root namespace's end of its veth pair
  absl::Status Iptables(int host, const std::vector<std::string>& args);

  HostsOptions options_;
  std::string prefix_;  // cxh<pid>: every name this object makes starts with it
  std::vector<Proc> procs_;
  std::vector<int> delayers_;  // per host: the handle of its connex-netdelay, or -1
  std::vector<double> loss_;
};

}  // namespace connex::chaos

#endif  // CONNEX_CHAOS_HOSTS_H_
