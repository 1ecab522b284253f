// The matrix kernels' templates, shared by kernels.cc (the vector code, built into the engine)
// and internal/kernels_scalar.cc (the portable code, built into the engine's tests only, to check
// that both give the same bits). Their definitions are in an unnamed namespace on purpose: each
// of the two files compiles its own copy with its own flags, and no instantiation can be shared
// (or mixed up by the linker) between them. Include it from those two files only.
#ifndef CONNEX_ENGINE_INTERNAL_KERNELS_IMPL_H_
#define CONNEX_ENGINE_INTERNAL_KERNELS_IMPL_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "connex/base/check.h"
#include "connex/engine/half.h"
#include "connex/engine/kernels.h"
#include "connex/engine/prefetch.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define CONNEX_KERNELS_SIMD 1
#endif

namespace connex::engine {
namespace {  // NOLINT(build/namespaces): see the top of the file

constexpr int64_t kTokenBlock = 32;  // tokens per pass over a block of weight rows
// Weight rows per register block when four tokens share a pass (4 x 4 accumulators fit the 32
// AVX-512 registers; AVX2 has 16, so 2 x 4 x 2 halves).
#if defined(__AVX512F__)
constexpr int kRowBlock = 4;
#else
constexpr int kRowBlock = 2;
#endif

// Rows per register block when only NT < 4 tokens share a pass (decode): the weights stream from
// memory once. 8 rows (4 with AVX2's 16 registers), i.e. 8 streams for the hardware prefetcher,
// streamed a BF16 decode step 1.3x as fast as 4 rows and a little faster than 16 (one core's CPU
// time, bench_engine --vs-bound --cpu-time). A software prefetch of the next block's rows only
// slowed it (by 15-25 %); each row's own look-ahead (kPrefetchAhead) is what pays.
template <int NT>
constexpr int StreamBlockRows() {
#if defined(__AVX512F__)
  return NT == 1 ? 8 : 4;
#else
  return NT == 1 ? 4 : 2;
#endif
}

// How far ahead of its loads a decode block prefetches each of its rows (see SimdChunks). 512
// bytes measured best of 256, 512, 1024 and 2048 (docs/results.md, "Decode against the bound").
constexpr int64_t kPrefetchAhead = 512;

template <DType kType>
constexpr int64_t kElementSize = kType == DType::kF32 ? 4 : 2;

// Checkpoints are little-endian, and the weights are read as they lie in the file.
static_assert(std::endian::native == std::endian::little);

// Element i of a row of kType weights, widened to fp32 (exactly). memcpy because a checkpoint's
// tensor may sit at any address.
template <DType kType>
inline float Widen(const char* row, int64_t i) {
  if constexpr (kType == DType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * i, sizeof(f));
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * i, sizeof(h));
    if constexpr (kType == DType::kF16) return F16ToFloat(h);
    return BF16ToFloat(h);
  }
}

#if defined(__AVX512F__)
// Weights i..i+16 of a row as one vector: bf16 is the high half of an fp32, F16C converts f16
// exactly (subnormals included), so lane j holds exactly Widen(row, i + j).
template <DType kType>
inline __m512 Load16(const char* p) {
  if constexpr (kType == DType::kF32) {
    return _mm512_loadu_ps(p);
  } else {
    // The maskz forms (all lanes) are the same instructions; the plain ones trip g++ 12's
    // -Wmaybe-uninitialized on their _mm512_undefined_* operand.
    constexpr __mmask16 kAll = 0xffff;
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (kType == DType::kF16) return _mm512_maskz_cvtph_ps(kAll, h);
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, h), 16));
  }
}
#elif defined(CONNEX_KERNELS_SIMD)
template <DType kType>
inline __m256 Load8(const char* p) {
  if constexpr (kType == DType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (kType == DType::kBF16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    alignas(32) float f[8];
    for (int j = 0; j < 8; ++j) f[j] = Widen<kType>(p, j);
    return _mm256_load_ps(f);
#endif
  }
}
#endif

inline float ReduceLanes(const float* acc) {
  float s8[8], s4[4];
  for (int j = 0; j < 8; ++j) s8[j] = acc[j] + acc[j + 8];
  for (int j = 0; j < 4; ++j) s4[j] = s8[j] + s8[j + 4];
  float s2[2] = {s4[0] + s4[2], s4[1] + s4[3]};
  return s2[0] + s2[1];
}

// The main loop of DotBlock over whole 16-element chunks, one vector lane per accumulator of the
// reduction. Returns where it stopped. `next_block`: in decode, the bytes from each row to the
// one the same block position holds in the next block (0: no next block).
#if defined(CONNEX_KERNELS_SIMD)
template <DType kType, int NR, int NT>
inline int64_t SimdChunks(const char* const* w, const float* const* x, int64_t n,
                          float (&acc)[NR][NT][kDotLanes], int64_t next_block) {
  constexpr int64_t kSize = kElementSize<kType>;
  int64_t i = 0;
  // Decode (NT < 4) streams each row once: prefetching every row kPrefetchAhead bytes ahead of
  // its loads, once per cache line, keeps more of the NR streams' lines in flight than the
  // hardware prefetcher does alone (it restarts at every 4 KiB page, i.e. every BF16 row of 2048).
  // Near a row's end the look-ahead goes on into the next block's row, not past the end (into
  // the next row of this block, read already): a block then starts with its rows' first lines
  // on their way. A 525 MB BF16 matrix streamed at 0.98-1.02 of a plain read's speed instead of
  // 0.92-0.93 (docs/design/engine.md). Past a range's last block the look-ahead is into rows
  // its thread usually reads next; a prefetch past the weights never faults.
  constexpr bool kPrefetch = NT < 4;
  const int64_t row_bytes = n * kSize;
  auto prefetch = [&](int64_t at) {
    if constexpr (kPrefetch) {
      if ((at * kSize) % 64 == 0) {
        int64_t ahead = at * kSize + kPrefetchAhead;
        if (next_block > 0 && ahead >= row_bytes) ahead += next_block - row_bytes;
        for (int r = 0; r < NR; ++r) PrefetchT0(w[r] + ahead);
      }
    }
  };
#if defined(__AVX512F__)
  __m512 a[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) a[r][t] = _mm512_setzero_ps();
  }
  auto chunk = [&](int64_t at) {
    prefetch(at);
    __m512 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_ps(x[t] + at);
    for (int r = 0; r < NR; ++r) {
      __m512 wv = Load16<kType>(w[r] + at * kSize);
      for (int t = 0; t < NT; ++t) a[r][t] = _mm512_fmadd_ps(wv, xv[t], a[r][t]);
    }
  };
#else
  __m256 lo[NR][NT], hi[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
  }
  auto chunk = [&](int64_t at) {
    prefetch(at);
    for (int r = 0; r < NR; ++r) {
      __m256 wlo = Load8<kType>(w[r] + at * kSize), whi = Load8<kType>(w[r] + (at + 8) * kSize);
      for (int t = 0; t < NT; ++t) {
        lo[r][t] = _mm256_fmadd_ps(wlo, _mm256_loadu_ps(x[t] + at), lo[r][t]);
        hi[r][t] = _mm256_fmadd_ps(whi, _mm256_loadu_ps(x[t] + at + 8), hi[r][t]);
      }
    }
  };
#endif
  for (; i + kDotLanes <= n; i += kDotLanes) chunk(i);
#if defined(__AVX512F__)
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) _mm512_storeu_ps(acc[r][t], a[r][t]);
  }
#else
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      _mm256_storeu_ps(acc[r][t], lo[r][t]);
      _mm256_storeu_ps(acc[r][t] + 8, hi[r][t]);
    }
  }
#endif
  return i;
}
#endif

template <DType kType, int NR, int NT>
inline int64_t ScalarChunks(const char* const* w, const float* const* x, int64_t n,
                            float (&acc)[NR][NT][kDotLanes]) {
  int64_t i = 0;
  for (; i + kDotLanes <= n; i += kDotLanes) {
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) {
        for (int j = 0; j < kDotLanes; ++j) {
          acc[r][t][j] = std::fma(Widen<kType>(w[r], i + j), x[t][i + j], acc[r][t][j]);
        }
      }
    }
  }
  return i;
}

// The NR x NT dot products of weight rows w[0..NR) (kType elements) with token rows x[0..NT).
// Each output is reduced exactly as DotReference does on the widened row (the 16 vector lanes are
// its 16 accumulators); computing several outputs in one pass only shares loads and hides
// latency. kSimd false: the portable code, even where vectors exist (tests). next_block: see
// SimdChunks.
template <DType kType, int NR, int NT, bool kSimd>
inline void DotBlock(const char* const* w, const float* const* x, int64_t n, float (&out)[NR][NT],
                     int64_t next_block = 0) {
  float acc[NR][NT][kDotLanes] = {};
  int64_t i;
#if defined(CONNEX_KERNELS_SIMD)
  if constexpr (kSimd) {
    i = SimdChunks<kType, NR, NT>(w, x, n, acc, next_block);
  } else {
    i = ScalarChunks<kType, NR, NT>(w, x, n, acc);
  }
#else
  (void)next_block;
  i = ScalarChunks<kType, NR, NT>(w, x, n, acc);
#endif
  for (int j = 0; i + j < n; ++j) {
    for (int r = 0; r < NR; ++r) {
      const float wj = Widen<kType>(w[r], i + j);
      for (int t = 0; t < NT; ++t) acc[r][t][j] = std::fma(wj, x[t][i + j], acc[r][t][j]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r][t] = ReduceLanes(acc[r][t]);
  }
}

// The rows of one matrix, read as kType: base, bytes per row, elements per row.
struct Rows {
  const char* base;
  int64_t stride;
  int64_t in;
  const char* row(int64_t r) const { return base + r * stride; }
};

// Outputs y[t * ldy + r] for rows [r, r + NR) and the NT tokens x[0..NT) (rows of `in` floats).
// next: whether the look-ahead goes on into rows [r + NR, r + 2 NR) (decode: SimdChunks).
template <DType kType, int NR, int NT, bool kSimd>
inline void Block(const Rows& w, int64_t r, const float* x, float* y, int64_t ldy,
                  bool next = false) {
  const char* ws[NR];
  for (int k = 0; k < NR; ++k) ws[k] = w.row(r + k);
  const float* xs[NT];
  for (int t = 0; t < NT; ++t) xs[t] = x + t * w.in;
  float out[NR][NT];
  DotBlock<kType, NR, NT, kSimd>(ws, xs, w.in, out, next ? NR * w.stride : 0);
  for (int k = 0; k < NR; ++k) {
    for (int t = 0; t < NT; ++t) y[t * ldy + r + k] = out[k][t];
  }
}

// Block for a number of tokens known at run time, 1..3.
template <DType kType, int NR, bool kSimd>
inline void BlockOfFew(int nt, const Rows& w, int64_t r, const float* x, float* y, int64_t ldy) {
  switch (nt) {
    case 1:
      return Block<kType, NR, 1, kSimd>(w, r, x, y, ldy);
    case 2:
      return Block<kType, NR, 2, kSimd>(w, r, x, y, ldy);
    default:
      CONNEX_DCHECK(nt == 3);
      return Block<kType, NR, 3, kSimd>(w, r, x, y, ldy);
  }
}

// Fewer than four tokens (decode): the rows stream from memory once, in tall blocks.
template <DType kType, int NT, bool kSimd>
void StreamRows(const Rows& w, const float* x, float* y, int64_t ldy, int64_t row_begin,
                int64_t row_end) {
  constexpr int NR = StreamBlockRows<NT>();
  int64_t r = row_begin;
  for (; r + NR <= row_end; r += NR) Block<kType, NR, NT, kSimd>(w, r, x, y, ldy, /*next=*/true);
  for (; r < row_end; ++r) Block<kType, 1, NT, kSimd>(w, r, x, y, ldy);
}

template <DType kType, bool kSimd>
void MatMulRowsOf(const WeightMatrix& m, const float* x, int64_t tokens, float* y, int64_t ldy,
                  int64_t row_begin, int64_t row_end) {
  const Rows w{static_cast<const char*>(m.data), m.cols * kElementSize<kType>, m.cols};
  for (int64_t t0 = 0; t0 < tokens; t0 += kTokenBlock) {
    const int64_t t1 = std::min(tokens, t0 + kTokenBlock);
    const int64_t full = t0 + (t1 - t0) / 4 * 4;  // tokens [t0, full) go four at a time
    const int few = static_cast<int>(t1 - full);  // the rest (0..3) together
    const float* xt = x + t0 * m.cols;
    float* yt = y + t0 * ldy;
    if (full == t0) {
      if (few == 1) StreamRows<kType, 1, kSimd>(w, xt, yt, ldy, row_begin, row_end);
      if (few == 2) StreamRows<kType, 2, kSimd>(w, xt, yt, ldy, row_begin, row_end);
      if (few == 3) StreamRows<kType, 3, kSimd>(w, xt, yt, ldy, row_begin, row_end);
      continue;
    }
    const float* xf = x + full * m.cols;
    float* yf = y + full * ldy;
    int64_t r = row_begin;
    for (; r + kRowBlock <= row_end; r += kRowBlock) {
      for (int64_t t = t0; t < full; t += 4) {
        Block<kType, kRowBlock, 4, kSimd>(w, r, x + t * m.cols, y + t * ldy, ldy);
      }
      if (few > 0) BlockOfFew<kType, kRowBlock, kSimd>(few, w, r, xf, yf, ldy);
    }
    for (; r < row_end; ++r) {
      for (int64_t t = t0; t < full; t += 4) {
        Block<kType, 1, 4, kSimd>(w, r, x + t * m.cols, y + t * ldy, ldy);
      }
      if (few > 0) BlockOfFew<kType, 1, kSimd>(few, w, r, xf, yf, ldy);
    }
  }
}

template <bool kSimd>
void MatMulRowsDispatch(const WeightMatrix& w, const float* x, int64_t tokens, float* y,
                        int64_t ldy, int64_t row_begin, int64_t row_end) {
  CONNEX_DCHECK(0 <= row_begin && row_begin <= row_end && row_end <= w.rows);
  switch (w.dtype) {
    case DType::kF32:
      return MatMulRowsOf<DType::kF32, kSimd>(w, x, tokens, y, ldy, row_begin, row_end);
    case DType::kF16:
      return MatMulRowsOf<DType::kF16, kSimd>(w, x, tokens, y, ldy, row_begin, row_end);
    case DType::kBF16:
      return MatMulRowsOf<DType::kBF16, kSimd>(w, x, tokens, y, ldy, row_begin, row_end);
    default:
      CONNEX_CHECK(false && "a weight matrix is F32, F16 or BF16");
  }
}

}  // namespace
}  // namespace connex::engine

#endif  // CONNEX_ENGINE_INTERNAL_KERNELS_IMPL_H_
