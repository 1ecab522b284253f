#include "connex/engine/kernels.h"

#include <algorithm>
#include <cmath>

#include "connex/base/check.h"
#include "connex/engine/internal/kernels_impl.h"

namespace connex::engine {
namespace {

// The weight bytes of a range of rows that MatMul's threads take at a time in a decode step over
// at least kStreamedBytes of weights (see MatMul).
constexpr int64_t kRangeBytes = 128 << 10;
constexpr int64_t kStreamedBytes = 4 << 20;

template <DType kType>
void WidenRowOf(const WeightMatrix& w, int64_t row, float* out) {
  const char* p = static_cast<const char*>(w.data) + row * w.cols * kElementSize<kType>;
  for (int64_t i = 0; i < w.cols; ++i) out[i] = Widen<kType>(p, i);
}

// The same two products for every weight type (out may be x).
template <DType kType>
void ScaleOf(const float* x, float inv, const WeightMatrix& weight, float* out) {
  const char* p = static_cast<const char*>(weight.data);
  for (int64_t i = 0; i < weight.cols; ++i) out[i] = x[i] * inv * Widen<kType>(p, i);
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) {
  const char* w = reinterpret_cast<const char*>(a);
  float out[1][1];
  DotBlock<DType::kF32, 1, 1, true>(&w, &b, n, out);
  return out[0][0];
}

void Dot4(const float* const* rows, const float* x, int64_t n, float* out) {
  const char* w[4];
  for (int k = 0; k < 4; ++k) w[k] = reinterpret_cast<const char*>(rows[k]);
  float block[4][1];
  DotBlock<DType::kF32, 4, 1, true>(w, &x, n, block);
  for (int k = 0; k < 4; ++k) out[k] = block[k][0];
}

float DotReference(const float* a, const float* b, int64_t n) {
  float acc[kDotLanes] = {};
  for (int64_t i = 0; i < n; ++i) acc[i % kDotLanes] = std::fma(a[i], b[i], acc[i % kDotLanes]);
  return ReduceLanes(acc);
}

void MatMulRows(const WeightMatrix& w, const float* x, int64_t tokens, float* y, int64_t ldy,
                int64_t row_begin, int64_t row_end) {
  MatMulRowsDispatch<true>(w, x, tokens, y, ldy, row_begin, row_end);
}

void MatMul(ThreadPool& pool, std::span<const MatMulOutput> outputs, const float* x,
            int64_t tokens) {
  int64_t total = 0;
  for (const MatMulOutput& o : outputs) {
    CONNEX_DCHECK(o.w.cols == outputs[0].w.cols);
    total += o.w.rows;
  }
  // A decode step over weights that stream from memory (kStreamedBytes and more): the threads
  // take the rows in ranges of about kRangeBytes of weights (a multiple of a decode block's rows)
  // rather than a half each, so that a thread the machine slows holds the step back by one range
  // instead of the whole step. Not for small matrices, whose step is mostly the fork-join (shared
  // ranges on every matrix cost the default model's decode step 5-20 %), nor for prefill (not
  // measured faster). A row's output does not depend on the range it is computed in.
  const int64_t row_bytes =
      std::max<int64_t>(1, outputs[0].w.cols * static_cast<int64_t>(DTypeSize(outputs[0].w.dtype)));
  const int64_t grain = tokens < 4 && total * row_bytes >= kStreamedBytes
                            ? std::max<int64_t>(8, kRangeBytes / row_bytes / 8 * 8)
                            : 0;
  pool.ParallelFor(
      total,
      [&](int64_t begin, int64_t end) {
        int64_t base = 0;
        for (const MatMulOutput& o : outputs) {
          int64_t b = std::max(begin, base), e = std::min(end, base + o.w.rows);
          if (b < e) MatMulRows(o.w, x, tokens, o.y, o.ldy, b - base, e - base);
          base += o.w.rows;
        }
      },
      grain);
}

void WidenRow(const WeightMatrix& w, int64_t row, float* out) {
  CONNEX_DCHECK(0 <= row && row < w.rows);
  switch (w.dtype) {
    case DType::kF32:
      return WidenRowOf<DType::kF32>(w, row, out);
    case DType::kF16:
      return WidenRowOf<DType::kF16>(w, row, out);
    case DType::kBF16:
      return WidenRowOf<DType::kBF16>(w, row, out);
    default:
      CONNEX_CHECK(false && "a weight matrix is F32, F16 or BF16");
  }
}

void RmsNorm(const float* x, const WeightMatrix& weight, float eps, float* out) {
  const int64_t n = weight.cols;
  float mean = Dot(x, x, n) / static_cast<float>(n);
  float inv = 1.0f / std::sqrt(mean + eps);
  switch (weight.dtype) {
    case DType::kF32:
      return ScaleOf<DType::kF32>(x, inv, weight, out);
    case DType::kF16:
      return ScaleOf<DType::kF16>(x, inv, weight, out);
    case DType::kBF16:
      return ScaleOf<DType::kBF16>(x, inv, weight, out);
    default:
      CONNEX_CHECK(false && "a weight matrix is F32, F16 or BF16");
  }
}

int64_t ArgMax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (values[i] > values[best] || (std::isnan(values[best]) && !std::isnan(values[i]))) best = i;
  }
  return best;
}

}  // namespace connex::engine
