// Subprocess: starts a real binary with its stdout on a pipe, reads its lines with deadlines and
// sends it signals — for multi-process tests that kill -9 their peers, and for connex-chaos,
// which runs whole deployments. A child dies with the thread that started it (PR_SET_PDEATHSIG),
// so nothing outlives a test or tool that was itself killed. Thread-compatible.
#ifndef CONNEX_BASE_SUBPROCESS_H_
#define CONNEX_BASE_SUBPROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace connex {

// The directory holding the project's binaries: CONNEX_BIN_DIR (set by CTest), else this
// binary's own directory.
std::string BinDir();

struct SubprocessOptions {
  // NAME=VALUE, added to (and overriding) this environment; of two entries of a name, the later.
  std::vector<std::string> env;
  bool capture_stderr = false;  // stderr to the stdout pipe
  std::string stderr_path;      // else, when set: stderr appended to this file
  // Run in this network namespace (a name under /run/netns, as `ip netns add` makes); empty:
  // this process's.
  std::string netns;
  // Run in a UTS namespace of its own with this host name (as a host of its own would have;
  // needs CAP_SYS_ADMIN); empty: this process's.
  std::string hostname;
};

class Subprocess {
 public:
  // Starts `argv` (argv[0] is a path) with `env` added to the environment. stderr is inherited
  // unless `capture_stderr`, in which case it goes to the same pipe as stdout.
  static std::optional<Subprocess> Start(const std::vector<std::string>& argv,
                                         const std::vector<std::string>& env = {},
                                         bool capture_stderr = false);
  // As above with every option; `error` (if given) says why it could not start.
  static std::optional<Subprocess> Start(const std::vector<std::string>& argv,
                                         const SubprocessOptions& options,
                                         std::string* error = nullptr);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();  // SIGKILLs and reaps a process still running

  pid_t pid() const { return pid_; }
  // The next line of output (without '\n'), or nullopt at EOF or after `timeout_ms`.
  std::optional<std::string> ReadLine(int64_t timeout_ms);
  // Reads lines until one contains `needle`; returns it, or nullopt after `timeout_ms`.
  std::optional<std::string> WaitForLine(const std::string& needle, int64_t timeout_ms);
  // Everything read so far.
  const std::string& transcript() const { return transcript_; }
  void Signal(int signal);
  // Waits for the exit; returns the exit code (128+signal when killed), or nullopt on timeout.
  std::optional<int> Wait(int64_t timeout_ms);
  // Whether it has exited (reaps it if so); never blocks.
  bool Exited() { return Wait(0).has_value(); }

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buffer_;
  std::string transcript_;
  std::optional<int> exit_code_;
};

}  // namespace connex

#endif  // CONNEX_BASE_SUBPROCESS_H_
