// The one place that picks a backend: an explicit switch, no static registration.
#include "connex/base/strings.h"
#include "connex/transport/mem/mem_engine.h"
#include "connex/transport/shm/shm_engine.h"
#include "connex/transport/tcp/tcp_engine.h"
#include "connex/transport/transfer_engine.h"
#include "connex/transport/ucx/ucx_engine.h"

namespace connex::transport {

absl::StatusOr<TransferEnginePtr> CreateTransferEngine(const TransportOptions& options) {
  switch (options.backend) {
    case Backend::kMem:
      return mem::CreateMemEngine(options);
    case Backend::kTcp:
      return tcp::CreateTcpEngine(options);
    case Backend::kShm:
      return shm::CreateShmEngine(options);
    case Backend::kUcx:
      return ucx::CreateUcxEngine(options);
    case Backend::kAuto:
      break;
  }
  return absl::UnimplementedError(
      StrCat("transport backend ", BackendName(options.backend), " is not built yet"));
}

}  // namespace connex::transport
