// The engine's numeric kernels. Every dot product in the model — matrix rows, attention scores,
// RMSNorm sums of squares — goes through one reduction order: lane j (of 16) accumulates
// fma(a[i], b[i], acc_j) for the indices i = j (mod 16) in increasing order, then the 16 lanes
// are added by a fixed binary tree. fma is exactly rounded, so a vectorised and a scalar
// evaluation give the same bits; how many tokens share a pass over a weight row, and which
// thread computes a row, changes nothing. Thread-safe (pure functions; the pool is thread-safe).
#ifndef CONNEX_ENGINE_KERNELS_H_
#define CONNEX_ENGINE_KERNELS_H_

#include <cstdint>
#include <span>

#include "connex/engine/thread_pool.h"

namespace connex::engine {

inline constexpr int kDotLanes = 16;

// The canonical dot product of a[0..n) and b[0..n).
float Dot(const float* a, const float* b, int64_t n);

// Four dot products sharing `x`: out[k] = Dot(rows[k], x, n), computed in one pass.
void Dot4(const float* const* rows, const float* x, int64_t n, float* out);

// The same reduction written one element at a time; tests check Dot against it bit for bit.
float DotReference(const float* a, const float* b, int64_t n);

// One output block of a matrix product: y[t * ldy + r] = Dot(w + r * in, x + t * in, in) for
// rows r in [row_begin, row_end) and tokens t in [0, tokens). Weight rows are read once per
// small group of tokens.
void MatMulRows(const float* w, int64_t in, const float* x, int64_t tokens, float* y, int64_t ldy,
                int64_t row_begin, int64_t row_end);

// A weight matrix [rows, in] and where its output goes: y[t * ldy + r].
struct MatMulOutput {
  const float* w;
  int64_t rows;
  float* y;
  int64_t ldy;
};

// Computes every output of `outputs` (all sharing the input x [tokens, in]) with one ParallelFor
// over the concatenated rows.
void MatMul(ThreadPool& pool, std::span<const MatMulOutput> outputs, const float* x, int64_t tokens,
            int64_t in);

// out[i] = x[i] * (1 / sqrt(Dot(x, x) / n + eps)) * weight[i].
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);

// Index of the largest value; the lowest index on ties. NaN never wins over a number.
int64_t ArgMax(const float* values, int64_t n);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_KERNELS_H_
