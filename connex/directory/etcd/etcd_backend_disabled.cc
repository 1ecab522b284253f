// RegisterEtcdBackend of a build configured with -DCONNEX_ETCD=OFF (no gRPC): etcd:// addresses
// are then refused with a message that says so.
#include "connex/directory/client.h"
#include "connex/directory/etcd/etcd_backend.h"
#include "connex/directory/internal/store.h"

namespace connex::directory {

void RegisterEtcdBackend() {
  internal::RegisterStore(
      "etcd",
      [](const DirectoryClientOptions& options,
         internal::WatchSink*) -> absl::StatusOr<std::unique_ptr<internal::DirectoryStore>> {
        return absl::FailedPreconditionError(
            "directory " + options.directory +
            ": this build has no etcd backend (configured with -DCONNEX_ETCD=OFF)");
      });
}

}  // namespace connex::directory
