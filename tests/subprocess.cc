#include "tests/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

extern char** environ;

namespace connex::testing {

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
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return std::nullopt;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 1);
  if (capture_stderr) posix_spawn_file_actions_adddup2(&actions, pipefd[1], 2);
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) environment.emplace_back(*e);
  for (const std::string& e : env) environment.push_back(e);
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : environment) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipefd[1]);
  if (rc != 0) {
    close(pipefd[0]);
    return std::nullopt;
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

}  // namespace connex::testing
