// The one place that picks a backend: an explicit switch, no static registration.
#include "connex/base/logging.h"
#include "connex/base/status.h"
#include "connex/base/strings.h"
#include "connex/transport/auto_engine.h"
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
  // auto: every backend that starts, in order of preference.
  std::vector<TransferEnginePtr> engines;
  if (options.fabric != nullptr) {
    CONNEX_ASSIGN_OR_RETURN(TransferEnginePtr in_process, mem::CreateMemEngine(options));
    engines.push_back(std::move(in_process));
  }
  using Factory = absl::StatusOr<TransferEnginePtr> (*)(const TransportOptions&);
  for (Backend b : options.auto_backends) {
    Factory f = b == Backend::kShm   ? &shm::CreateShmEngine
                : b == Backend::kUcx ? &ucx::CreateUcxEngine
                : b == Backend::kTcp ? &tcp::CreateTcpEngine
                                     : nullptr;
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          StrCat("transport auto: ", BackendName(b), " cannot be one of its backends"));
    }
    absl::StatusOr<TransferEnginePtr> e = f(options);
    if (e.ok()) {
      engines.push_back(std::move(*e));
    } else {
      CONNEX_LOG_WARN("transport auto: a backend is unavailable: {}", e.status().ToString());
    }
  }
  return CreateAutoEngine(std::move(engines));
}

}  // namespace connex::transport
