// Small statistics for the benchmarks. Thread-safe (stateless).
#ifndef CONNEX_BASE_STATS_H_
#define CONNEX_BASE_STATS_H_

#include <algorithm>
#include <cstddef>
#include <vector>

namespace connex {

// The `p`-quantile (0 <= p <= 1) of `values` by nearest rank: p = 0.5 is the median, 1 the
// maximum. 0 for no values.
inline double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(i, values.size() - 1)];
}

}  // namespace connex

#endif  // CONNEX_BASE_STATS_H_
