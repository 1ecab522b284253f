#include "connex/pp/pd.h"

#include "connex/base/strings.h"

namespace connex::pp {

const char* PdRoleName(PdRole role) {
  switch (role) {
    case PdRole::kNone:
      return "none";
    case PdRole::kFrontend:
      return "frontend";
    case PdRole::kPrefill:
      return "prefill";
    case PdRole::kDecode:
      return "decode";
  }
  return "none";
}

absl::StatusOr<PdRole> ParsePdRole(std::string_view name, std::string_view what) {
  for (PdRole r : {PdRole::kNone, PdRole::kFrontend, PdRole::kPrefill, PdRole::kDecode}) {
    if (name == PdRoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      StrCat(what, ": '", name, "' is not a role (none, frontend, prefill or decode)"));
}

uint32_t PdGroup(PdRole role, uint32_t stage) {
  switch (role) {
    case PdRole::kNone:
      return stage;
    case PdRole::kFrontend:
      return kPdFrontendGroup;
    case PdRole::kPrefill:
      return kPdPrefillGroup;
    case PdRole::kDecode:
      return kPdDecodeGroup;
  }
  return stage;
}

const char* PdGroupName(uint32_t group) {
  switch (group) {
    case kPdFrontendGroup:
      return "frontend";
    case kPdPrefillGroup:
      return "prefill";
    case kPdDecodeGroup:
      return "decode";
    default:
      return "?";
  }
}

}  // namespace connex::pp
