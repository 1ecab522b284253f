// CONNEX_CHECK(condition): an invariant of Connex's own code, checked in every build type. When
// it does not hold, the process logs the condition and where it is, flushes the log and aborts:
// going on would corrupt state (a slot handed out twice, a step run on another request's
// state). Never for input from outside the process — a malformed frame, a bad flag, a wrong
// epoch gets a Status naming what was wrong.
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

#endif  // CONNEX_BASE_CHECK_H_
