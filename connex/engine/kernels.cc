#include "connex/engine/kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace connex::engine {
namespace {

constexpr int64_t kTokenBlock = 32;  // tokens per pass over a block of weight rows
// Weight rows per register block when several tokens share a pass (4 x 4 accumulators fit the 32
// AVX-512 registers; AVX2 has 16, so 2 x 4 x 2 halves).
#if defined(__AVX512F__)
constexpr int kRowBlock = 4;
#else
constexpr int kRowBlock = 2;
#endif

inline float ReduceLanes(const float* acc) {
  float s8[8], s4[4];
  for (int j = 0; j < 8; ++j) s8[j] = acc[j] + acc[j + 8];
  for (int j = 0; j < 4; ++j) s4[j] = s8[j] + s8[j + 4];
  float s2[2] = {s4[0] + s4[2], s4[1] + s4[3]};
  return s2[0] + s2[1];
}

// The NR x NT dot products of weight rows w[0..NR) with token rows x[0..NT). Each output is
// reduced exactly as DotReference does (the 16 vector lanes are its 16 accumulators); computing
// several outputs in one pass only shares loads and hides FMA latency.
template <int NR, int NT>
inline void DotBlock(const float* const* w, const float* const* x, int64_t n,
                     float (&out)[NR][NT]) {
  alignas(64) float acc[NR][NT][kDotLanes];
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 a[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) a[r][t] = _mm512_setzero_ps();
  }
  for (; i + kDotLanes <= n; i += kDotLanes) {
    __m512 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_ps(x[t] + i);
    for (int r = 0; r < NR; ++r) {
      __m512 wv = _mm512_loadu_ps(w[r] + i);
      for (int t = 0; t < NT; ++t) a[r][t] = _mm512_fmadd_ps(wv, xv[t], a[r][t]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) _mm512_store_ps(acc[r][t], a[r][t]);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 lo[NR][NT], hi[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
  }
  for (; i + kDotLanes <= n; i += kDotLanes) {
    for (int r = 0; r < NR; ++r) {
      __m256 wlo = _mm256_loadu_ps(w[r] + i), whi = _mm256_loadu_ps(w[r] + i + 8);
      for (int t = 0; t < NT; ++t) {
        lo[r][t] = _mm256_fmadd_ps(wlo, _mm256_loadu_ps(x[t] + i), lo[r][t]);
        hi[r][t] = _mm256_fmadd_ps(whi, _mm256_loadu_ps(x[t] + i + 8), hi[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      _mm256_store_ps(acc[r][t], lo[r][t]);
      _mm256_store_ps(acc[r][t] + 8, hi[r][t]);
    }
  }
#else
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      for (int j = 0; j < kDotLanes; ++j) acc[r][t][j] = 0.0f;
    }
  }
  for (; i + kDotLanes <= n; i += kDotLanes) {
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) {
        for (int j = 0; j < kDotLanes; ++j) {
          acc[r][t][j] = std::fma(w[r][i + j], x[t][i + j], acc[r][t][j]);
        }
      }
    }
  }
#endif
  for (int j = 0; i + j < n; ++j) {
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t][j] = std::fma(w[r][i + j], x[t][i + j], acc[r][t][j]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r][t] = ReduceLanes(acc[r][t]);
  }
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) {
  float out[1][1];
  DotBlock<1, 1>(&a, &b, n, out);
  return out[0][0];
}

void Dot4(const float* const* rows, const float* x, int64_t n, float* out) {
  float block[4][1];
  DotBlock<4, 1>(rows, &x, n, block);
  for (int k = 0; k < 4; ++k) out[k] = block[k][0];
}

float DotReference(const float* a, const float* b, int64_t n) {
  float acc[kDotLanes] = {};
  for (int64_t i = 0; i < n; ++i) acc[i % kDotLanes] = std::fma(a[i], b[i], acc[i % kDotLanes]);
  return ReduceLanes(acc);
}

void MatMulRows(const float* w, int64_t in, const float* x, int64_t tokens, float* y, int64_t ldy,
                int64_t row_begin, int64_t row_end) {
  for (int64_t t0 = 0; t0 < tokens; t0 += kTokenBlock) {
    int64_t t1 = std::min(tokens, t0 + kTokenBlock);
    int64_t full = t0 + (t1 - t0) / 4 * 4;  // tokens [t0, full) go four at a time
    if (full > t0) {
      int64_t r = row_begin;
      for (; r + kRowBlock <= row_end; r += kRowBlock) {
        const float* ws[kRowBlock];
        for (int k = 0; k < kRowBlock; ++k) ws[k] = w + (r + k) * in;
        for (int64_t t = t0; t < full; t += 4) {
          const float* xs[4] = {x + t * in, x + (t + 1) * in, x + (t + 2) * in, x + (t + 3) * in};
          float out[kRowBlock][4];
          DotBlock<kRowBlock, 4>(ws, xs, in, out);
          for (int k = 0; k < kRowBlock; ++k) {
            for (int j = 0; j < 4; ++j) y[(t + j) * ldy + r + k] = out[k][j];
          }
        }
      }
      for (; r < row_end; ++r) {
        const float* wr = w + r * in;
        for (int64_t t = t0; t < full; t += 4) {
          const float* xs[4] = {x + t * in, x + (t + 1) * in, x + (t + 2) * in, x + (t + 3) * in};
          float out[1][4];
          DotBlock<1, 4>(&wr, xs, in, out);
          for (int k = 0; k < 4; ++k) y[(t + k) * ldy + r] = out[0][k];
        }
      }
    }
    for (int64_t t = full; t < t1; ++t) {  // the rest one at a time, four rows per pass
      const float* xt = x + t * in;
      int64_t r = row_begin;
      for (; r + 4 <= row_end; r += 4) {
        const float* ws[4] = {w + r * in, w + (r + 1) * in, w + (r + 2) * in, w + (r + 3) * in};
        float out[4][1];
        DotBlock<4, 1>(ws, &xt, in, out);
        for (int k = 0; k < 4; ++k) y[t * ldy + r + k] = out[k][0];
      }
      for (; r < row_end; ++r) {
        const float* wr = w + r * in;
        float out[1][1];
        DotBlock<1, 1>(&wr, &xt, in, out);
        y[t * ldy + r] = out[0][0];
      }
    }
  }
}

void MatMul(ThreadPool& pool, std::span<const MatMulOutput> outputs, const float* x, int64_t tokens,
            int64_t in) {
  int64_t total = 0;
  for (const MatMulOutput& o : outputs) total += o.rows;
  pool.ParallelFor(total, [&](int64_t begin, int64_t end) {
    int64_t base = 0;
    for (const MatMulOutput& o : outputs) {
      int64_t b = std::max(begin, base), e = std::min(end, base + o.rows);
      if (b < e) MatMulRows(o.w, in, x, tokens, o.y, o.ldy, b - base, e - base);
      base += o.rows;
    }
  });
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  float mean = Dot(x, x, n) / static_cast<float>(n);
  float inv = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

int64_t ArgMax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (values[i] > values[best] || (std::isnan(values[best]) && !std::isnan(values[i]))) best = i;
  }
  return best;
}

}  // namespace connex::engine
