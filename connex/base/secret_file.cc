#include "connex/base/secret_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "connex/base/strings.h"

namespace connex {

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(StrCat("secret file '", path, "': ", std::strerror(errno)));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(
        StrCat("secret file '", path, "' may be read by others (chmod 600 it)"));
  }
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) line.clear();
  size_t begin = line.find_first_not_of(" \t\r\n");
  size_t end = line.find_last_not_of(" \t\r\n");
  if (begin == std::string::npos) {
    return absl::InvalidArgumentError(StrCat("secret file '", path, "' is empty"));
  }
  return line.substr(begin, end - begin + 1);
}

}  // namespace connex
