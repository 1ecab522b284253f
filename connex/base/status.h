// Status helpers shared by every layer. Debian's abseil (20220623) has no RETURN_IF_ERROR, so
// the project keeps this one small macro pair. Thread-safe (stateless).
#ifndef CONNEX_BASE_STATUS_H_
#define CONNEX_BASE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CONNEX_STATUS_CONCAT_INNER_(a, b) a##b
#define CONNEX_STATUS_CONCAT_(a, b) CONNEX_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define CONNEX_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status connex_status_ = (expr);          \
    if (!connex_status_.ok()) return connex_status_; \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its status from the enclosing function.
#define CONNEX_ASSIGN_OR_RETURN(lhs, expr) \
  CONNEX_ASSIGN_OR_RETURN_IMPL_(CONNEX_STATUS_CONCAT_(connex_statusor_, __LINE__), lhs, expr)

#define CONNEX_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace connex {

// Returns `status` with `prefix: ` prepended to its message (same code, same payloads). OK stays
// OK.
absl::Status Annotate(const absl::Status& status, std::string_view prefix);

}  // namespace connex

#endif  // CONNEX_BASE_STATUS_H_
