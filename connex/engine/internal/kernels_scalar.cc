#include "connex/engine/internal/kernels_scalar.h"

#include "connex/engine/internal/kernels_impl.h"

namespace connex::engine {

void MatMulRowsScalarForTest(const WeightMatrix& w, const float* x, int64_t tokens, float* y,
                             int64_t ldy, int64_t row_begin, int64_t row_end) {
  MatMulRowsDispatch<false>(w, x, tokens, y, ldy, row_begin, row_end);
}

}  // namespace connex::engine
