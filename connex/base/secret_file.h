// Reading a secret from a file (secrets never come from argv). Thread-safe (stateless).
#ifndef CONNEX_BASE_SECRET_FILE_H_
#define CONNEX_BASE_SECRET_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace connex {

// The first line of `path`, without surrounding whitespace. InvalidArgument naming the file when
// it cannot be read or is empty; refuses a file that others may read (mode & 077), as ssh does.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

}  // namespace connex

#endif  // CONNEX_BASE_SECRET_FILE_H_
