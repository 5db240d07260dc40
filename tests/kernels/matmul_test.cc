// MatMul (packed panels, register blocks, threads) against its scalar fma-chain twin: equal
// with ==, for every row count, shape and thread count. This is the batch invariance that the
// backend's bit-exactness rests on.
#include "kernels/cpu/matmul.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/thread_pool.h"

namespace prefixd {
namespace {

std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every register-block path this CPU can run (all must give the same bits).
std::vector<MatMulIsa> Isas() {
  std::vector<MatMulIsa> isas = {MatMulIsa::kAvx2};
  if (MatMulIsaSupported(MatMulIsa::kAvx512)) isas.push_back(MatMulIsa::kAvx512);
  return isas;
}

// Restores the automatic choice when a test ends.
class MatMulTest : public ::testing::Test {
 protected:
  ~MatMulTest() override { SetMatMulIsa(MatMulIsa::kAuto); }
};

struct Shape {
  int64_t k, n;
};

TEST_F(MatMulTest, EqualsScalarFmaChainForEveryRowCountAndThreadCount) {
  // k = 300 crosses the AVX-512 path's K blocks (128) twice, with a partial last block.
  const Shape shapes[] = {{1, 1}, {7, 5}, {16, 64}, {33, 65}, {64, 130}, {96, 200}, {300, 70}};
  const int64_t row_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 14, 97, 104, 200};
  ThreadPool pool2(2);
  ThreadPool pool3(3);
  for (const Shape& s : shapes) {
    const std::vector<float> w = RandomVector(s.k * s.n, 1);
    const std::vector<float> bias = RandomVector(s.n, 2);
    const PackedMatrix packed = PackedMatrix::Pack(w.data(), s.k, s.n, /*transposed=*/false);
    for (int64_t m : row_counts) {
      const std::vector<float> a = RandomVector(m * s.k, 3 + m);
      std::vector<float> want(m * s.n);
      MatMulReference(a.data(), m, s.k, w.data(), s.k, s.n, bias.data(), want.data(), s.n);
      for (MatMulIsa isa : Isas()) {
        SetMatMulIsa(isa);
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
          std::vector<float> got(m * s.n, -1.0f);
          MatMul(a.data(), m, s.k, packed, bias.data(), got.data(), s.n, pool);
          ASSERT_EQ(got, want) << "k=" << s.k << " n=" << s.n << " m=" << m
                               << " isa=" << static_cast<int>(isa);
        }
      }
    }
  }
}

TEST_F(MatMulTest, RowResultDoesNotDependOnItsNeighbours) {
  // The same row computed alone (decode path) and at every offset inside a larger batch.
  const int64_t k = 40, n = 70;
  const std::vector<float> w = RandomVector(k * n, 5);
  const PackedMatrix packed = PackedMatrix::Pack(w.data(), k, n, false);
  const std::vector<float> row = RandomVector(k, 6);
  std::vector<float> alone(n);
  SetMatMulIsa(MatMulIsa::kAvx2);
  MatMul(row.data(), 1, k, packed, nullptr, alone.data(), n, nullptr);
  for (MatMulIsa isa : Isas()) {
    SetMatMulIsa(isa);
    for (int64_t m = 1; m <= 17; ++m) {
      for (int64_t at = 0; at < m; ++at) {
        std::vector<float> batch = RandomVector(m * k, 100 + m);
        std::copy(row.begin(), row.end(), batch.begin() + at * k);
        std::vector<float> out(m * n);
        MatMul(batch.data(), m, k, packed, nullptr, out.data(), n, nullptr);
        ASSERT_EQ(std::vector<float>(out.begin() + at * n, out.begin() + (at + 1) * n), alone)
            << "m=" << m << " at=" << at << " isa=" << static_cast<int>(isa);
      }
    }
  }
}

TEST_F(MatMulTest, TransposedPackReadsRowMajorNByK) {
  const int64_t k = 9, n = 70;
  const std::vector<float> wt = RandomVector(n * k, 7);  // [n, k]
  std::vector<float> w(k * n);                           // [k, n]
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) w[j * n + i] = wt[i * k + j];
  const PackedMatrix packed = PackedMatrix::Pack(wt.data(), k, n, /*transposed=*/true);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) ASSERT_EQ(packed.at(j, i), w[j * n + i]);
  const std::vector<float> a = RandomVector(3 * k, 8);
  std::vector<float> want(3 * n), got(3 * n);
  MatMulReference(a.data(), 3, k, w.data(), k, n, nullptr, want.data(), n);
  MatMul(a.data(), 3, k, packed, nullptr, got.data(), n, nullptr);
  EXPECT_EQ(got, want);
}

TEST_F(MatMulTest, HonoursRowStrides) {
  const int64_t k = 8, n = 10, m = 4, lda = 13, ldc = 17;
  const std::vector<float> w = RandomVector(k * n, 9);
  const PackedMatrix packed = PackedMatrix::Pack(w.data(), k, n, false);
  const std::vector<float> a = RandomVector(m * lda, 10);
  std::vector<float> want(m * ldc, 5.0f), got(m * ldc, 5.0f);
  MatMulReference(a.data(), m, lda, w.data(), k, n, nullptr, want.data(), ldc);
  MatMul(a.data(), m, lda, packed, nullptr, got.data(), ldc, nullptr);
  EXPECT_EQ(got, want);  // including the untouched 5.0 padding between rows
}

}  // namespace
}  // namespace prefixd
