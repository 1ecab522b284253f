#include "connex/base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

extern char** environ;

namespace connex {

std::string BinDir() {
  const char* dir = std::getenv("CONNEX_BIN_DIR");
  if (dir != nullptr) return dir;
  // Every binary of the build lands in one directory: this one's.
  std::error_code error;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "build/bin" : self.parent_path().string();
}

std::optional<Subprocess> Subprocess::Start(const std::vector<std::string>& argv,
                                            const std::vector<std::string>& env,
                                            bool capture_stderr) {
  SubprocessOptions options;
  options.env = env;
  options.capture_stderr = capture_stderr;
  return Start(argv, options);
}

std::optional<Subprocess> Subprocess::Start(const std::vector<std::string>& argv,
                                            const SubprocessOptions& options, std::string* error) {
  auto fail = [error](std::string why) -> std::optional<Subprocess> {
    if (error != nullptr) *error = std::move(why);
    return std::nullopt;
  };
  if (argv.empty()) return fail("no program to start");
  // Everything the child needs is made before fork: after it, only async-signal-safe calls.
  // This environment, then `env`: an entry replaces any earlier one of its name.
  std::vector<std::string> environment;
  auto add = [&environment](std::string entry) {
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) {
      std::erase_if(environment, [&](const std::string& e) {
        return e.compare(0, eq + 1, entry, 0, eq + 1) == 0;
      });
    }
    environment.push_back(std::move(entry));
  };
  for (char** e = environ; *e != nullptr; ++e) environment.emplace_back(*e);
  for (const std::string& e : options.env) add(e);
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : environment) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  int netns_fd = -1;
  if (!options.netns.empty()) {
    const std::string path = "/run/netns/" + options.netns;
    netns_fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (netns_fd < 0) return fail(path + ": " + std::strerror(errno));
  }
  int err_fd = -1;
  if (!options.capture_stderr && !options.stderr_path.empty()) {
    err_fd = open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (err_fd < 0) {
      if (netns_fd >= 0) close(netns_fd);
      return fail(options.stderr_path + ": " + std::strerror(errno));
    }
  }
  int pipefd[2];
  int status_pipe[2];  // the child writes errno here when exec fails; closed by a good exec
  if (pipe2(pipefd, O_CLOEXEC) != 0 || pipe2(status_pipe, O_CLOEXEC) != 0) {
    if (netns_fd >= 0) close(netns_fd);
    if (err_fd >= 0) close(err_fd);
    return fail(std::string("pipe: ") + std::strerror(errno));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // The child dies with the thread that started it, and never outlives its parent.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int code = 0;
    if (getppid() != parent) _exit(127);
    if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) code = errno;
    if (code == 0 && !options.hostname.empty() &&
        (unshare(CLONE_NEWUTS) != 0 ||
         sethostname(options.hostname.data(), options.hostname.size()) != 0)) {
      code = errno;
    }
    if (code == 0 && dup2(pipefd[1], 1) < 0) code = errno;
    if (code == 0 && options.capture_stderr && dup2(pipefd[1], 2) < 0) code = errno;
    if (code == 0 && err_fd >= 0 && dup2(err_fd, 2) < 0) code = errno;
    if (code == 0) {
      execve(cargv[0], cargv.data(), cenv.data());
      code = errno;
    }
    ssize_t ignored = write(status_pipe[1], &code, sizeof(code));
    (void)ignored;
    _exit(127);
  }
  const int fork_errno = errno;
  close(pipefd[1]);
  close(status_pipe[1]);
  if (netns_fd >= 0) close(netns_fd);
  if (err_fd >= 0) close(err_fd);
  if (pid < 0) {
    close(pipefd[0]);
    close(status_pipe[0]);
    return fail(std::string("fork: ") + std::strerror(fork_errno));
  }
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(status_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(status_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status;
    waitpid(pid, &status, 0);
    close(pipefd[0]);
    return fail(argv[0] + ": " + std::strerror(child_errno));
  }
  Subprocess p;
  p.pid_ = pid;
  p.fd_ = pipefd[0];
  return p;
}

Subprocess::Subprocess(Subprocess&& other) noexcept { *this = std::move(other); }

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  std::swap(pid_, other.pid_);
  std::swap(fd_, other.fd_);
  std::swap(buffer_, other.buffer_);
  std::swap(transcript_, other.transcript_);
  std::swap(exit_code_, other.exit_code_);
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  if (fd_ >= 0) close(fd_);
}

std::optional<std::string> Subprocess::ReadLine(int64_t timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (fd_ < 0) return std::nullopt;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(left));
    if (rc <= 0) continue;
    char chunk[4096];
    ssize_t n = read(fd_, chunk, sizeof(chunk));
    if (n <= 0) {
      close(fd_);
      fd_ = -1;
      if (!buffer_.empty()) {
        std::string line;
        line.swap(buffer_);
        return line;
      }
      return std::nullopt;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    transcript_.append(chunk, static_cast<size_t>(n));
  }
}

std::optional<std::string> Subprocess::WaitForLine(const std::string& needle, int64_t timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) return std::nullopt;
    std::optional<std::string> line = ReadLine(left);
    if (!line) return std::nullopt;
    if (line->find(needle) != std::string::npos) return line;
  }
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0 && !exit_code_) kill(pid_, signal);
}

std::optional<int> Subprocess::Wait(int64_t timeout_ms) {
  if (exit_code_) return exit_code_;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace connex
