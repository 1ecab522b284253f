// Secrets of the directory: per-incarnation credentials, the admin token, and reading a secret
// from a file (secrets never come from argv). Thread-safe (stateless).
#ifndef CONNEX_DIRECTORY_SECRET_H_
#define CONNEX_DIRECTORY_SECRET_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "connex/base/secret_file.h"

namespace connex::directory {

// 128 bits from the kernel's CSPRNG (getrandom), as 32 hex digits.
std::string NewCredential();

// `size` bytes as lower-case hex digits (credentials, and the digests the etcd backend stores).
std::string HexOf(const unsigned char* bytes, size_t size);

// Compares secrets in time independent of where they differ. An empty secret equals nothing.
bool SecretsEqual(std::string_view a, std::string_view b);

using ::connex::ReadSecretFile;  // connex/base/secret_file.h

// The admin token from the environment: the first line of CONNEX_DIRECTORY_ADMIN_TOKEN_FILE when
// set, else CONNEX_DIRECTORY_ADMIN_TOKEN, else empty.
absl::StatusOr<std::string> AdminTokenFromEnv();
// The shared token likewise: CONNEX_DIRECTORY_TOKEN_FILE, else CONNEX_DIRECTORY_TOKEN.
absl::StatusOr<std::string> TokenFromEnv();

// Secure by default: where a machine's directory token lives when none is configured —
// $CONNEX_HOME/directory.token, CONNEX_HOME defaulting to $HOME/.connex. connex-directory makes
// it on its first start (unless --insecure) and every client of this user reads it, as Erlang
// nodes share ~/.erlang.cookie: out of the box a stranger without it is refused.
absl::StatusOr<std::string> DefaultTokenPath();
// The default token: the one in DefaultTokenPath(), or a new random secret written there (the
// folder made 0700, the file 0600, atomically: concurrent first starts agree on one token).
// `path` (if given) gets the file's path.
absl::StatusOr<std::string> EnsureDefaultToken(std::string* path = nullptr);
// A client's token: TokenFromEnv(), else the default token file when it exists, else "".
absl::StatusOr<std::string> ClientTokenFromEnv();

}  // namespace connex::directory

#endif  // CONNEX_DIRECTORY_SECRET_H_
