// Loads a directory backend built as a plugin (internal/store.h: LoadStorePlugin): the etcd
// backend, libconnex-etcd.so, which carries gRPC and protobuf so that the programs that accept
// etcd:// do not link them (docs/design/etcd.md, "The plugin").
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "connex/base/mutex.h"
#include "connex/base/strings.h"
#include "connex/directory/internal/store.h"

namespace connex::directory::internal {
namespace {

// The folder of the running program (from /proc/self/exe); empty if it cannot be read.
std::string ProgramDir() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  const std::string exe(path, static_cast<size_t>(n));
  const size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "" : exe.substr(0, slash);
}

}  // namespace

absl::Status LoadStorePlugin(const std::string& scheme) {
  static Mutex mu;
  MutexLock lock(&mu);
  const std::string file = StrCat("libconnex-", scheme, ".so");
  // CONNEX_PLUGIN_DIR, then beside the program (a build tree's bin/ holds both), then ../lib/connex
  // (an installed layout: PREFIX/bin and PREFIX/lib/connex).
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("CONNEX_PLUGIN_DIR"); dir != nullptr && *dir != '\0') {
    candidates.push_back(StrCat(dir, "/", file));
  }
  if (const std::string dir = ProgramDir(); !dir.empty()) {
    candidates.push_back(StrCat(dir, "/", file));
    candidates.push_back(StrCat(dir, "/../lib/connex/", file));
  }
  std::string tried;
  for (const std::string& path : candidates) {
    if (::access(path.c_str(), F_OK) != 0) {
      tried += StrCat(tried.empty() ? "" : ", ", path, " (absent)");
      continue;
    }
    // The plugin resolves the directory library's symbols against this program's (which exports
    // them), so that it registers its backend in this program's registry.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = ::dlerror();
      return absl::FailedPreconditionError(StrCat("cannot load the ", scheme, " backend ", path,
                                                  ": ", error ? error : "dlopen failed"));
    }
    const std::string entry = StrCat("connex_", scheme, "_plugin_register_v1");
    auto* register_backend = reinterpret_cast<void (*)()>(::dlsym(handle, entry.c_str()));
    if (register_backend == nullptr) {
      return absl::FailedPreconditionError(
          StrCat(path, " is no Connex ", scheme, " backend (it has no ", entry, ")"));
    }
    register_backend();  // the handle stays open: the backend's code runs until exit
    return absl::OkStatus();
  }
  return absl::NotFoundError(StrCat("the ", scheme, " backend ", file, " is not installed (tried ",
                                    tried.empty() ? "nothing: no CONNEX_PLUGIN_DIR and no program "
                                                    "folder"
                                                  : tried,
                                    "; set CONNEX_PLUGIN_DIR to its folder)"));
}

}  // namespace connex::directory::internal
