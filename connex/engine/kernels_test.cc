#include "connex/engine/kernels.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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
    MatMulRows(w.data(), in, x.data(), tokens, y.data(), rows, 0, 13);
    MatMulRows(w.data(), in, x.data(), tokens, y.data(), rows, 13, 14);
    MatMulRows(w.data(), in, x.data(), tokens, y.data(), rows, 14, rows);
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
    MatMulOutput outputs[] = {{w1.data(), 50, y.data(), 71}, {w2.data(), 21, y.data() + 50, 71}};
    MatMul(pool, outputs, x.data(), tokens, in);
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
  RmsNorm(x.data(), w.data(), 2, 0.0f, out.data());
  float inv = 1.0f / std::sqrt(12.5f);
  EXPECT_FLOAT_EQ(out[0], 3 * inv);
  EXPECT_FLOAT_EQ(out[1], 8 * inv);
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 3, 4, 5, 100}) {
      std::vector<std::atomic<int>> hits(n);
      for (int rep = 0; rep < 20; ++rep) {
        pool.ParallelFor(n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
      }
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 20);
    }
  }
}

}  // namespace
}  // namespace connex::engine
