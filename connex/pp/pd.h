// Prefill-decode disaggregation (docs/design/pd.md): the roles of a PD deployment and the
// directory groups they register under. A PD deployment is a two-stage pipeline of one model
// whose later stage comes in two pools: stage 0, the frontends (the OpenAI API, the tokenizer,
// the embedding; the owners of the requests), in group 0; every prefill instance in group 1;
// every decode instance in group 2. A prefill and a decode instance run the same layers (the
// whole model after the embedding); a request is prefilled on one, its KV is handed to the other
// with one-sided reads (the KV standby's mirrors), and the decode instance generates.
#ifndef CONNEX_PP_PD_H_
#define CONNEX_PP_PD_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace connex::pp {

enum class PdRole { kNone, kFrontend, kPrefill, kDecode };

inline constexpr uint32_t kPdFrontendGroup = 0;
inline constexpr uint32_t kPdPrefillGroup = 1;
inline constexpr uint32_t kPdDecodeGroup = 2;
// Groups of a PD deployment (frontends, prefill, decode).
inline constexpr uint32_t kPdGroups = 3;

// "none", "frontend", "prefill", "decode".
const char* PdRoleName(PdRole role);
// The name's role; InvalidArgument naming `what` (a flag or variable) and the value otherwise.
absl::StatusOr<PdRole> ParsePdRole(std::string_view name, std::string_view what);
// The directory group of a node of `role` at pipeline stage `stage` (kNone: the stage itself).
uint32_t PdGroup(PdRole role, uint32_t stage);
// The role of a PD deployment's group, for messages: "frontend", "prefill", "decode".
const char* PdGroupName(uint32_t group);

}  // namespace connex::pp

#endif  // CONNEX_PP_PD_H_
