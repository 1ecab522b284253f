// MatMulRows through the portable scalar code (what a build without AVX runs), to check in tests
// that it gives the same bits as the vector code that the engine runs. Built into the engine's
// tests only (connex_engine_kernels_scalar), so that the engine's build does not compile the
// scalar kernels it never calls. Thread-safe (a pure function).
#ifndef CONNEX_ENGINE_INTERNAL_KERNELS_SCALAR_H_
#define CONNEX_ENGINE_INTERNAL_KERNELS_SCALAR_H_

#include <cstdint>

#include "connex/engine/kernels.h"

namespace connex::engine {

void MatMulRowsScalarForTest(const WeightMatrix& w, const float* x, int64_t tokens, float* y,
                             int64_t ldy, int64_t row_begin, int64_t row_end);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_INTERNAL_KERNELS_SCALAR_H_
