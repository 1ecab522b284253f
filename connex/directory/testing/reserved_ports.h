// Ports for a test's directory that must still be free when the directory restarts at them
// (a SIGKILLed directory comes back at the same address). They are taken below the ephemeral
// range, so that no outgoing connection gets them while the directory is down; and they are
// reserved among tests with a lock file per port (flock, held for the reservation's life and
// dropped by the kernel if the process dies), so that two tests running at once — `make test`
// runs four — never pick the same ports: one did, in a cold `.ci/run` (a restart found its port
// taken: "Address already in use").
#ifndef CONNEX_DIRECTORY_TESTING_RESERVED_PORTS_H_
#define CONNEX_DIRECTORY_TESTING_RESERVED_PORTS_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace connex::directory::testing {

class ReservedPorts {
 public:
  // `count` consecutive ports in [20000, 32000), free now and reserved against every other
  // process that reserves through this class; nullopt when none were found in 200 tries.
  static std::optional<ReservedPorts> Take(int count) {
    const std::filesystem::path locks =
        std::filesystem::temp_directory_path() / "connex-test-port-locks";
    std::error_code ignored;
    std::filesystem::create_directories(locks, ignored);
    std::mt19937 rng(std::random_device{}());
    for (int attempt = 0; attempt < 200; ++attempt) {
      ReservedPorts r;
      r.first_ = 20000 + static_cast<int>(rng() % static_cast<uint32_t>(12000 - count));
      bool ok = true;
      for (int p = r.first_; ok && p < r.first_ + count; ++p) {
        const std::string path = (locks / (std::to_string(p) + ".lock")).string();
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) {
          ok = false;
          break;
        }
        r.fds_.push_back(fd);
        ok = ::flock(fd, LOCK_EX | LOCK_NB) == 0 && Bindable(p);
      }
      if (ok) return r;
    }
    return std::nullopt;
  }

  ReservedPorts(ReservedPorts&& other) noexcept
      : first_(other.first_), fds_(std::move(other.fds_)) {
    other.fds_.clear();
  }
  ReservedPorts& operator=(ReservedPorts&& other) noexcept {
    std::swap(first_, other.first_);
    std::swap(fds_, other.fds_);
    return *this;
  }
  ~ReservedPorts() {
    for (int fd : fds_) ::close(fd);  // releases the locks
  }

  int first() const { return first_; }

 private:
  ReservedPorts() = default;

  // Whether 127.0.0.1:`port` can be listened on now (a process that does not reserve may hold it).
  static bool Bindable(int port) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return false;
    const int one = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as ZeroMQ's listeners
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_port = htons(static_cast<uint16_t>(port));
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0;
    ::close(s);
    return ok;
  }

  int first_ = 0;
  std::vector<int> fds_;
};

}  // namespace connex::directory::testing

#endif  // CONNEX_DIRECTORY_TESTING_RESERVED_PORTS_H_
