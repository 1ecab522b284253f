#include "connex/base/check.h"

#include <cstdlib>

#include "connex/base/logging.h"
#include "connex/base/logging_spdlog.h"

namespace connex::internal {

void CheckFailed(const char* condition, const char* file, int line) {
  Log().critical("CONNEX_CHECK failed at {}:{}: {}", file, line, condition);
  Log().flush();
  std::abort();
}

}  // namespace connex::internal
