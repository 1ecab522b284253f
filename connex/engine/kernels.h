// The engine's numeric kernels. Every dot product in the model — matrix rows, attention scores,
// RMSNorm sums of squares — goes through one reduction order: lane j (of 16) accumulates
// fma(a[i], b[i], acc_j) for the indices i = j (mod 16) in increasing order, then the 16 lanes
// are added by a fixed binary tree. fma is exactly rounded, so a vectorised and a scalar
// evaluation give the same bits; how many tokens share a pass over a weight row, and which
// thread computes a row, changes nothing. Weights are read in their checkpoint's precision (F32,
// F16 or BF16) and widened to fp32 in registers, exactly, so their precision in memory changes
// nothing either. Thread-safe (pure functions; the pool is thread-safe).
#ifndef CONNEX_ENGINE_KERNELS_H_
#define CONNEX_ENGINE_KERNELS_H_

#include <cstdint>
#include <span>

#include "connex/engine/tensor_dict.h"
#include "connex/engine/thread_pool.h"

namespace connex::engine {

inline constexpr int kDotLanes = 16;

// A read-only weight matrix [rows, cols], row-major, of F32, F16 or BF16 elements — usually a
// tensor of a memory-mapped checkpoint used in place, at whatever address the file puts it (the
// kernels make no alignment assumption). A vector (a norm's weights) is a matrix of one row.
// Every F16 and BF16 value is exactly an fp32 value, so the kernels give, bit for bit, the
// results they give on the matrix widened to F32.
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;

  static WeightMatrix F32(const float* data, int64_t rows, int64_t cols) {
    return {data, DType::kF32, rows, cols};
  }
  int64_t bytes() const { return rows * cols * static_cast<int64_t>(DTypeSize(dtype)); }
};

// The canonical dot product of a[0..n) and b[0..n).
float Dot(const float* a, const float* b, int64_t n);

// Four dot products sharing `x`: out[k] = Dot(rows[k], x, n), computed in one pass.
void Dot4(const float* const* rows, const float* x, int64_t n, float* out);

// The same reduction written one element at a time; tests check Dot against it bit for bit.
float DotReference(const float* a, const float* b, int64_t n);

// One output block of a matrix product: y[t * ldy + r] = Dot(row r of w widened, x + t * cols,
// cols) for rows r in [row_begin, row_end) and tokens t in [0, tokens). Each weight row is read
// from memory once per 32 tokens, whatever the number of tokens.
void MatMulRows(const WeightMatrix& w, const float* x, int64_t tokens, float* y, int64_t ldy,
                int64_t row_begin, int64_t row_end);

// A weight matrix and where its output goes: y[t * ldy + r].
struct MatMulOutput {
  WeightMatrix w;
  float* y;
  int64_t ldy;
};

// Computes every output of `outputs` (all sharing the input x [tokens, cols]: their matrices have
// the same number of columns) with one ParallelFor over the concatenated rows.
void MatMul(ThreadPool& pool, std::span<const MatMulOutput> outputs, const float* x,
            int64_t tokens);

// out[0..cols) = row `row` of `w`, widened to fp32 (an embedding lookup).
void WidenRow(const WeightMatrix& w, int64_t row, float* out);

// out[i] = x[i] * (1 / sqrt(Dot(x, x) / n + eps)) * weight[i], for the n = weight.cols values of
// the one-row `weight`.
void RmsNorm(const float* x, const WeightMatrix& weight, float eps, float* out);

// Index of the largest value; the lowest index on ties. NaN never wins over a number.
int64_t ArgMax(const float* values, int64_t n);

}  // namespace connex::engine

#endif  // CONNEX_ENGINE_KERNELS_H_
