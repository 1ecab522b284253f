#include "connex/base/status.h"

#include "absl/strings/cord.h"
#include "connex/base/strings.h"

namespace connex {

absl::Status Annotate(const absl::Status& status, std::string_view prefix) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), StrCat(prefix, ": ", status.message()));
  // Payloads (structured details, e.g. a compacted revision, an epoch ended by a LEAVE) stay.
  status.ForEachPayload([&annotated](absl::string_view url, const absl::Cord& payload) {
    annotated.SetPayload(url, payload);
  });
  return annotated;
}

}  // namespace connex
