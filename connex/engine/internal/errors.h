// Errors the engine's readers of configs and checkpoints share. Internal to connex/engine.
#ifndef CONNEX_ENGINE_INTERNAL_ERRORS_H_
#define CONNEX_ENGINE_INTERNAL_ERRORS_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace connex::engine::internal {

// InvalidArgument with `what` as its message (what names the field or tensor that is wrong).
inline absl::Status Bad(std::string_view what) {
  return absl::InvalidArgumentError(std::string(what));
}

}  // namespace connex::engine::internal

#endif  // CONNEX_ENGINE_INTERNAL_ERRORS_H_
