#include "connex/base/status.h"

#include "connex/base/strings.h"

namespace connex {

absl::Status Annotate(const absl::Status& status, std::string_view prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), StrCat(prefix, ": ", status.message()));
}

}  // namespace connex
