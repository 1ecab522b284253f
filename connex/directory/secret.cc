#include "connex/directory/secret.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "connex/base/config.h"
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"

namespace connex::directory {

std::string NewCredential() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // getrandom only fails for bad arguments or a kernel older than 3.17: a broken host, and
      // no credential may be made from anything weaker.
      CONNEX_LOG_FATAL("directory: getrandom failed: {}", std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  return HexOf(bytes, sizeof(bytes));
}

std::string HexOf(const unsigned char* bytes, size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xf]);
  }
  return out;
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  if (a.empty() || b.empty()) return false;
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? a[i] : 0;
    unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

namespace {

absl::StatusOr<std::string> SecretFromEnv(const std::string& name) {
  std::string file_variable = name + "_FILE";
  std::string file = EnvString(file_variable, "");
  if (!file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile(file);
    if (!token.ok()) return Annotate(token.status(), file_variable);
    return token;
  }
  return EnvString(name, "");
}

}  // namespace

absl::StatusOr<std::string> AdminTokenFromEnv() {
  return SecretFromEnv("CONNEX_DIRECTORY_ADMIN_TOKEN");
}

absl::StatusOr<std::string> TokenFromEnv() { return SecretFromEnv("CONNEX_DIRECTORY_TOKEN"); }

absl::StatusOr<std::string> DefaultTokenPath() {
  std::string home = EnvString("CONNEX_HOME", "");
  if (home.empty()) {
    std::string user_home = EnvString("HOME", "");
    if (user_home.empty()) {  // a service without HOME: the user's home from the password file
      if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr) {
        user_home = pw->pw_dir;
      }
    }
    if (user_home.empty()) {
      return absl::FailedPreconditionError(
          "no directory token is configured and neither CONNEX_HOME nor HOME is set to keep the "
          "default one in: set CONNEX_DIRECTORY_TOKEN_FILE (or --insecure on a trusted network)");
    }
    home = user_home + "/.connex";
  }
  return home + "/directory.token";
}

absl::StatusOr<std::string> EnsureDefaultToken(std::string* path_out) {
  CONNEX_ASSIGN_OR_RETURN(std::string path, DefaultTokenPath());
  if (path_out != nullptr) *path_out = path;
  const std::string folder = path.substr(0, path.rfind('/'));
  if (mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        StrCat("cannot make ", folder, " for the directory token: ", std::strerror(errno)));
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    // Written whole under another name, then linked: a concurrent first start either links
    // first or finds this one's; nobody reads a half-written token.
    const std::string temp = StrCat(path, ".", getpid(), ".new");
    {
      const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) {
        return absl::FailedPreconditionError(
            StrCat("cannot write the directory token ", temp, ": ", std::strerror(errno)));
      }
      const std::string line = NewCredential() + NewCredential() + "\n";
      const bool written = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
      close(fd);
      if (!written) {
        unlink(temp.c_str());
        return absl::FailedPreconditionError(StrCat("cannot write the directory token ", temp));
      }
    }
    const bool linked = link(temp.c_str(), path.c_str()) == 0;
    const int link_errno = errno;
    unlink(temp.c_str());
    if (!linked && link_errno != EEXIST) {
      return absl::FailedPreconditionError(
          StrCat("cannot create the directory token ", path, ": ", std::strerror(link_errno)));
    }
    if (linked) CONNEX_LOG_INFO("directory: made the directory token {}", path);
  }
  return ReadSecretFile(path);
}

absl::StatusOr<std::string> ClientTokenFromEnv() {
  CONNEX_ASSIGN_OR_RETURN(std::string token, TokenFromEnv());
  if (!token.empty()) return token;
  absl::StatusOr<std::string> path = DefaultTokenPath();
  if (!path.ok()) return std::string();
  struct stat st {};
  if (stat(path->c_str(), &st) != 0) return std::string();
  absl::StatusOr<std::string> fallback = ReadSecretFile(*path);
  if (!fallback.ok()) return Annotate(fallback.status(), "the default directory token");
  return fallback;
}

}  // namespace connex::directory
