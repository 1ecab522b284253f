// CreateUcxEngine of a build configured with -DCONNEX_UCX=OFF (no UCX): the ucx backend is
// refused by name; `auto` goes on with the others.
#include "connex/transport/ucx/ucx_engine.h"

namespace connex::transport::ucx {

absl::StatusOr<TransferEnginePtr> CreateUcxEngine(const TransportOptions&) {
  return absl::UnavailableError(
      "transport ucx: this build has no UCX backend (configured with -DCONNEX_UCX=OFF)");
}

}  // namespace connex::transport::ucx
