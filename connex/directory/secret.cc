#include "connex/directory/secret.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
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
      CONNEX_LOG_ERROR("directory: getrandom failed: {}", std::strerror(errno));
      std::abort();
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

}  // namespace connex::directory
