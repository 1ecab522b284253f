#include "connex/engine/kernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "connex/base/mutex.h"
#include "connex/engine/half.h"
#include "connex/engine/internal/kernels_scalar.h"
#include "gtest/gtest.h"

namespace connex::engine {
namespace {

std::vector<float> RandomVector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

TEST(KernelsTest, DotMatchesScalarReferenceBitForBit) {
  std::mt19937 rng(1);
  for (int64_t n : {0, 1, 5, 15, 16, 17, 31, 33, 64, 72, 100, 384, 1000}) {
    std::vector<float> a = RandomVector(n, rng), b = RandomVector(n, rng);
    EXPECT_TRUE(SameBits(Dot(a.data(), b.data(), n), DotReference(a.data(), b.data(), n))) << n;
  }
}

TEST(KernelsTest, Dot4MatchesDot) {
  std::mt19937 rng(4);
  for (int64_t n : {3, 16, 18, 64, 77}) {
    std::vector<float> m = RandomVector(4 * n, rng), x = RandomVector(n, rng);
    const float* rows[4] = {m.data(), m.data() + n, m.data() + 2 * n, m.data() + 3 * n};
    float out[4];
    Dot4(rows, x.data(), n, out);
    for (int k = 0; k < 4; ++k) EXPECT_TRUE(SameBits(out[k], Dot(rows[k], x.data(), n))) << n;
  }
}

TEST(KernelsTest, DotReferenceIsNotASequentialSum) {
  // The fixed order is observable: 16 lanes then a tree, which rounds differently from a
  // left-to-right sum for these values. (Guards against a "reference" that equals anything.)
  std::vector<float> a(32, 1.0f), b(32, 1e-8f);
  b[0] = 1.0f;
  float sequential = 0.0f;
  for (int i = 0; i < 32; ++i) sequential += a[i] * b[i];
  EXPECT_EQ(sequential, 1.0f);                            // every 1e-8 is lost against 1
  EXPECT_GT(DotReference(a.data(), b.data(), 32), 1.0f);  // lanes sum the small ones first
}

TEST(KernelsTest, MatMulRowsIsInvariantToTokenCountAndRowRange) {
  std::mt19937 rng(2);
  const int64_t rows = 37, in = 72;
  std::vector<float> w = RandomVector(rows * in, rng);
  for (int64_t tokens : {1, 2, 3, 4, 5, 7, 8, 33, 70}) {
    std::vector<float> x = RandomVector(tokens * in, rng), y(tokens * rows);
    const WeightMatrix m = WeightMatrix::F32(w.data(), rows, in);
    MatMulRows(m, x.data(), tokens, y.data(), rows, 0, 13);
    MatMulRows(m, x.data(), tokens, y.data(), rows, 13, 14);
    MatMulRows(m, x.data(), tokens, y.data(), rows, 14, rows);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(SameBits(y[t * rows + r], Dot(w.data() + r * in, x.data() + t * in, in)))
            << "token " << t << " of " << tokens << ", row " << r;
      }
    }
  }
}

TEST(KernelsTest, MatMulIsInvariantToThreadCount) {
  std::mt19937 rng(3);
  const int64_t in = 100, tokens = 9;
  std::vector<float> w1 = RandomVector(50 * in, rng), w2 = RandomVector(21 * in, rng);
  std::vector<float> x = RandomVector(tokens * in, rng);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::vector<float> y(tokens * 71);
    MatMulOutput outputs[] = {{WeightMatrix::F32(w1.data(), 50, in), y.data(), 71},
                              {WeightMatrix::F32(w2.data(), 21, in), y.data() + 50, 71}};
    MatMul(pool, outputs, x.data(), tokens);
    results.push_back(y);
  }
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_EQ(std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)),
              0);
  }
  EXPECT_TRUE(SameBits(results[0][71 * 8 + 60], Dot(w2.data() + 10 * in, x.data() + 8 * in, in)));
}

TEST(KernelsTest, ArgMaxTakesLowestIndexOnTies) {
  std::vector<float> v = {1, 3, 2, 3, -1};
  EXPECT_EQ(ArgMax(v.data(), 5), 1);
  std::vector<float> nan = {NAN, 0.5f, 0.5f};
  EXPECT_EQ(ArgMax(nan.data(), 3), 1);
}

TEST(KernelsTest, RmsNormNormalises) {
  std::vector<float> x = {3, 4}, w = {1, 2}, out(2);
  RmsNorm(x.data(), WeightMatrix::F32(w.data(), 1, 2), 0.0f, out.data());
  float inv = 1.0f / std::sqrt(12.5f);
  EXPECT_FLOAT_EQ(out[0], 3 * inv);
  EXPECT_FLOAT_EQ(out[1], 8 * inv);
}

// A weight matrix in a 16-bit format, stored at an odd address (a checkpoint aligns nothing), and
// the same values widened to F32 by the scalar conversions of half.h.
struct TypedWeights {
  std::vector<uint8_t> storage;
  std::vector<float> widened;
  WeightMatrix typed;
  WeightMatrix f32;
};

TypedWeights MakeTyped(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  TypedWeights w;
  std::vector<float> values = RandomVector(rows * cols, rng);
  // Some subnormal and some large values: each format's exact widening is the point.
  for (size_t i = 0; i < values.size(); i += 7) values[i] *= dtype == DType::kF16 ? 1e-6f : 1e-39f;
  for (size_t i = 3; i < values.size(); i += 11) values[i] *= 3e4f;
  w.storage.resize(1 + values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t h = dtype == DType::kF16 ? FloatToF16(values[i]) : FloatToBF16(values[i]);
    std::memcpy(w.storage.data() + 1 + 2 * i, &h, 2);
    w.widened.push_back(dtype == DType::kF16 ? F16ToFloat(h) : BF16ToFloat(h));
  }
  w.typed = {w.storage.data() + 1, dtype, rows, cols};
  w.f32 = WeightMatrix::F32(w.widened.data(), rows, cols);
  return w;
}

TEST(KernelsTest, TypedWeightsGiveTheBitsOfTheirWidenedCopy) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int64_t rows : {1, 3, 17, 40}) {
      for (int64_t in : {1, 15, 16, 17, 33, 100, 129}) {
        TypedWeights w = MakeTyped(dtype, rows, in, rng);
        for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 8, 11, 33, 38}) {
          std::vector<float> x = RandomVector(tokens * in, rng);
          std::vector<float> typed(tokens * rows), widened(tokens * rows), scalar(tokens * rows);
          // The typed matrix in two row ranges, its widened copy in one.
          MatMulRows(w.typed, x.data(), tokens, typed.data(), rows, 0, rows / 2);
          MatMulRows(w.typed, x.data(), tokens, typed.data(), rows, rows / 2, rows);
          MatMulRows(w.f32, x.data(), tokens, widened.data(), rows, 0, rows);
          MatMulRowsScalarForTest(w.typed, x.data(), tokens, scalar.data(), rows, 0, rows);
          for (int64_t t = 0; t < tokens; ++t) {
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = t * rows + r;
              const float reference =
                  DotReference(w.widened.data() + r * in, x.data() + t * in, in);
              ASSERT_TRUE(SameBits(typed[i], reference) && SameBits(widened[i], reference) &&
                          SameBits(scalar[i], reference))
                  << DTypeName(dtype) << " " << rows << "x" << in << ", token " << t << " of "
                  << tokens << ", row " << r << ": " << typed[i] << " " << widened[i] << " "
                  << scalar[i] << " " << reference;
            }
          }
        }
      }
    }
  }
}

TEST(KernelsTest, ScalarPathGivesTheBitsOfTheVectorPath) {
  std::mt19937 rng(6);
  const int64_t rows = 41, in = 77;
  std::vector<float> w = RandomVector(rows * in, rng);
  const WeightMatrix m = WeightMatrix::F32(w.data(), rows, in);
  for (int64_t tokens : {1, 2, 3, 4, 9, 40}) {
    std::vector<float> x = RandomVector(tokens * in, rng), y(tokens * rows), s(tokens * rows);
    MatMulRows(m, x.data(), tokens, y.data(), rows, 0, rows);
    MatMulRowsScalarForTest(m, x.data(), tokens, s.data(), rows, 0, rows);
    EXPECT_EQ(std::memcmp(y.data(), s.data(), y.size() * sizeof(float)), 0) << tokens;
  }
}

TEST(KernelsTest, TypedMatMulIsInvariantToThreadCount) {
  std::mt19937 rng(7);
  const int64_t in = 300, tokens = 3;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    // Two matrices sharing the input, as q/k/v or gate/up do; one typed, one F32.
    TypedWeights w1 = MakeTyped(dtype, 70, in, rng);
    std::vector<float> w2 = RandomVector(19 * in, rng), x = RandomVector(tokens * in, rng);
    std::vector<float> expected(tokens * 89);
    {
      ThreadPool one(1);
      MatMulOutput outputs[] = {{w1.f32, expected.data(), 89},
                                {WeightMatrix::F32(w2.data(), 19, in), expected.data() + 70, 89}};
      MatMul(one, outputs, x.data(), tokens);
    }
    for (int threads : {1, 2, 3, 8}) {
      ThreadPool pool(threads);
      std::vector<float> y(tokens * 89);
      MatMulOutput outputs[] = {{w1.typed, y.data(), 89},
                                {WeightMatrix::F32(w2.data(), 19, in), y.data() + 70, 89}};
      MatMul(pool, outputs, x.data(), tokens);
      EXPECT_EQ(std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)), 0)
          << DTypeName(dtype) << ", " << threads << " threads";
    }
  }
}

// A decode step over 4 MB and more of weights has its rows taken in ranges from a shared
// counter (MatMul); its outputs are the bits of one thread's, whatever thread took which range.
// Two fused matrices of 1,000 and 100 rows of 1,024 floats (4.5 MB), 1 to 3 tokens.
TEST(KernelsTest, AStreamedDecodeTakenInRangesGivesTheBitsOfOneThread) {
  std::mt19937 rng(11);
  const int64_t in = 1024;
  std::vector<float> w1 = RandomVector(1000 * in, rng), w2 = RandomVector(100 * in, rng);
  for (int64_t tokens : {1, 2, 3}) {
    std::vector<float> x = RandomVector(tokens * in, rng), expected(tokens * 1100);
    {
      ThreadPool one(1);
      MatMulOutput outputs[] = {
          {WeightMatrix::F32(w1.data(), 1000, in), expected.data(), 1100},
          {WeightMatrix::F32(w2.data(), 100, in), expected.data() + 1000, 1100}};
      MatMul(one, outputs, x.data(), tokens);
    }
    EXPECT_TRUE(SameBits(expected[999], Dot(w1.data() + 999 * in, x.data(), in)));
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      for (int rep = 0; rep < 3; ++rep) {  // the ranges fall to the threads differently each time
        std::vector<float> y(tokens * 1100);
        MatMulOutput outputs[] = {{WeightMatrix::F32(w1.data(), 1000, in), y.data(), 1100},
                                  {WeightMatrix::F32(w2.data(), 100, in), y.data() + 1000, 1100}};
        MatMul(pool, outputs, x.data(), tokens);
        EXPECT_EQ(std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)), 0)
            << tokens << " tokens, " << threads << " threads";
      }
    }
  }
}

TEST(KernelsTest, TypedEmbeddingAndNormWeightsWidenExactly) {
  std::mt19937 rng(8);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    TypedWeights w = MakeTyped(dtype, 5, 37, rng);
    std::vector<float> row(37);
    WidenRow(w.typed, 3, row.data());
    EXPECT_EQ(std::memcmp(row.data(), w.widened.data() + 3 * 37, 37 * sizeof(float)), 0);
    const WeightMatrix norm = {w.typed.data, dtype, 1, 37},
                       norm32 = {w.f32.data, DType::kF32, 1, 37};
    std::vector<float> x = RandomVector(37, rng), typed(37), widened(37);
    RmsNorm(x.data(), norm, 1e-5f, typed.data());
    RmsNorm(x.data(), norm32, 1e-5f, widened.data());
    EXPECT_EQ(std::memcmp(typed.data(), widened.data(), 37 * sizeof(float)), 0);
    RmsNorm(x.data(), norm, 1e-5f, x.data());  // in place
    EXPECT_EQ(std::memcmp(x.data(), widened.data(), 37 * sizeof(float)), 0);
  }
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t grain : {0, 1, 3, 8}) {
      for (int64_t n : {0, 1, 3, 4, 5, 8, 9, 100}) {
        std::vector<std::atomic<int>> hits(n);
        for (int rep = 0; rep < 20; ++rep) {
          pool.ParallelFor(
              n,
              [&](int64_t b, int64_t e) {
                ASSERT_LT(b, e);
                // A range of `grain` starts at a multiple of it and is `grain` long but for the
                // last one (one thread, or n <= grain: [0, n) at once).
                if (grain > 0 && n > grain && threads > 1) {
                  EXPECT_EQ(b % grain, 0) << "n " << n << " grain " << grain;
                  EXPECT_EQ(e, std::min(n, b + grain)) << "n " << n << " grain " << grain;
                }
                for (int64_t i = b; i < e; ++i) hits[i]++;
              },
              grain);
        }
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_EQ(hits[i].load(), 20) << "index " << i << " n " << n << " grain " << grain;
        }
      }
    }
  }
}

// With a grain, a thread that is held up does not hold back the ranges: the others take them.
TEST(ThreadPoolTest, ARangeHeldUpLeavesTheOthersToTheOtherThreads) {
  ThreadPool pool(2);
  std::atomic<bool> release{false};
  std::atomic<int> taken_while_held{0};
  pool.ParallelFor(
      64,
      [&](int64_t b, int64_t) {
        if (b == 0) {
          // Holds range 0 until the other thread has taken every other range.
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          while (!release.load() && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::yield();
          }
          return;
        }
        if (taken_while_held.fetch_add(1) + 1 == 63) release.store(true);
      },
      1);
  EXPECT_TRUE(release.load()) << "the other thread did not take the 63 other ranges";
  EXPECT_EQ(taken_while_held.load(), 63);
}

// With a grain, each thread streams through memory in order: its own share's ranges front to
// back (the caller's share is the first half, the worker's the second), then the other share's
// from its back, so that the two threads read far apart until they meet.
TEST(ThreadPoolTest, EachThreadTakesItsShareInOrderThenTheOtherFromItsBack) {
  ThreadPool pool(2);
  for (int rep = 0; rep < 20; ++rep) {
    Mutex mu;
    std::map<std::thread::id, std::vector<int64_t>> taken;
    pool.ParallelFor(
        64,
        [&](int64_t b, int64_t e) {
          EXPECT_EQ(e, b + 1);
          MutexLock lock(&mu);
          taken[std::this_thread::get_id()].push_back(b);
        },
        1);
    int64_t total = 0;
    for (const auto& [id, seq] : taken) {
      total += static_cast<int64_t>(seq.size());
      size_t i = 0;
      if (seq[0] == 0 || seq[0] == 32) {  // its own share, in order
        for (i = 1; i < seq.size() && seq[i] == seq[i - 1] + 1;) ++i;
      }
      if (i == seq.size()) continue;
      // Then the other share, from its back.
      EXPECT_TRUE(seq[i] == 31 || seq[i] == 63) << "rep " << rep << ": took " << seq[i];
      for (++i; i < seq.size(); ++i) EXPECT_EQ(seq[i], seq[i - 1] - 1) << "rep " << rep;
    }
    EXPECT_EQ(total, 64);
  }
}

}  // namespace
}  // namespace connex::engine
