// CONNEX_CHECK(condition): an invariant of Connex's own code, checked in every build type. When
// it does not hold, the process logs the condition and where it is, flushes the log and aborts:
// going on would corrupt state (a slot handed out twice, a step run on another request's
// state). Never for input from outside the process — a malformed frame, a bad flag, a wrong
// epoch gets a Status naming what was wrong. CONNEX_DCHECK(condition) is the same in debug
// builds without NDEBUG (Debug, the ASan build) and compiles to nothing that
// runs under NDEBUG, for checks too costly for a hot path.
#ifndef CONNEX_BASE_CHECK_H_
#define CONNEX_BASE_CHECK_H_

#include "absl/base/optimization.h"

namespace connex::internal {

[[noreturn]] void CheckFailed(const char* condition, const char* file, int line);

}  // namespace connex::internal

#define CONNEX_CHECK(condition)                                        \
  do {                                                                 \
    if (ABSL_PREDICT_FALSE(!(condition))) {                            \
      ::connex::internal::CheckFailed(#condition, __FILE__, __LINE__); \
    }                                                                  \
  } while (false)

#ifdef NDEBUG
#define CONNEX_DCHECK(condition) \
  do {                           \
    if (false) {                 \
      (void)(condition);         \
    }                            \
  } while (false)
#else
#define CONNEX_DCHECK(condition) CONNEX_CHECK(condition)
#endif

#endif  // CONNEX_BASE_CHECK_H_
