// Lid: the stable logical identity of a Connex endpoint, (model, group, shard, replica), printed
// and parsed as `model/g1/s0/r1`. A value type; thread-compatible.
#ifndef CONNEX_BASE_LID_H_
#define CONNEX_BASE_LID_H_

#include <compare>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace connex {

struct Lid {
  std::string model;     // [A-Za-z0-9._-]+, at most kMaxModelLength bytes
  uint32_t group = 0;    // role index: pipeline stage, prefill pool, decode pool, ...
  uint32_t shard = 0;    // tensor-parallel shard within the group
  uint32_t replica = 0;  // replica chain

  static constexpr size_t kMaxModelLength = 128;

  // `model/g<group>/s<shard>/r<replica>`.
  std::string ToString() const;

  // Parses `model/g1/s0/r1`. InvalidArgument names the part that is malformed.
  static absl::StatusOr<Lid> Parse(std::string_view text);

  // Checks the model name; InvalidArgument says what is wrong with it.
  static absl::Status ValidateModel(std::string_view model);

  friend auto operator<=>(const Lid&, const Lid&) = default;
  friend bool operator==(const Lid&, const Lid&) = default;

  template <typename H>
  friend H AbslHashValue(H h, const Lid& lid) {
    return H::combine(std::move(h), lid.model, lid.group, lid.shard, lid.replica);
  }
};

inline std::ostream& operator<<(std::ostream& os, const Lid& lid) { return os << lid.ToString(); }

}  // namespace connex

#endif  // CONNEX_BASE_LID_H_
