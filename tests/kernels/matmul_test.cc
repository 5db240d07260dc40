// MatMul (packed panels, register blocks, threads) against its scalar fma-chain twin: equal
// with ==, for every row count, shape, thread count, instruction set and weight dtype (the
// twin then multiplies by the weights rounded to that dtype). This is the batch invariance
// that the backend's bit-exactness rests on.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
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
  if (MatMulIsaSupported(MatMulIsa::kAvxVnni)) isas.push_back(MatMulIsa::kAvxVnni);
  if (MatMulIsaSupported(MatMulIsa::kAvx512)) isas.push_back(MatMulIsa::kAvx512);
  if (MatMulIsaSupported(MatMulIsa::kAmx)) isas.push_back(MatMulIsa::kAmx);
  return isas;
}

// Restores the automatic choice when a test ends. Where the CPU has AVX-512 VNNI but no AMX,
// kAmx runs with emulated tiles (matmul.h, SetAmxEmulationForTesting), so that the AMX blocks'
// tiling and order are checked here too; on an AMX host the tiles themselves are.
class MatMulTest : public ::testing::Test {
 protected:
  MatMulTest() {
    if (!MatMulIsaSupported(MatMulIsa::kAmx)) SetAmxEmulationForTesting(true);
  }
  ~MatMulTest() override {
    SetMatMulIsa(MatMulIsa::kAuto);
    SetAmxEmulationForTesting(false);
  }
};

struct Shape {
  int64_t k, n;
};

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI8};

// What an int8 pack of w [k, n] holds, from QuantizeInt8Block on each column's blocks: the
// rounded weights [k, n] and their scales [ceil(k / kInt8BlockK), n].
struct Int8Weights {
  std::vector<int8_t> q;
  std::vector<float> scale;
};
Int8Weights QuantizeColumns(const std::vector<float>& w, int64_t k, int64_t n) {
  const int64_t blocks = (k + kInt8BlockK - 1) / kInt8BlockK;
  Int8Weights out{std::vector<int8_t>(k * n), std::vector<float>(blocks * n)};
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * kInt8BlockK, len = std::min(kInt8BlockK, k - k0);
      std::vector<float> column(len);
      std::vector<int8_t> q(len);
      for (int64_t i = 0; i < len; ++i) column[i] = w[(k0 + i) * n + j];
      out.scale[b * n + j] = QuantizeInt8Block(column.data(), len, q.data());
      for (int64_t i = 0; i < len; ++i) out.q[(k0 + i) * n + j] = q[i];
    }
  }
  return out;
}

// w with every element rounded to `dtype` (what a matrix packed at that dtype multiplies by).
std::vector<float> Rounded(std::vector<float> w, DType dtype) {
  for (float& x : w) x = RoundToDType(x, dtype);
  return w;
}

TEST_F(MatMulTest, EqualsScalarFmaChainForEveryRowCountThreadCountAndDType) {
  // k = 300 and 1000 cross the batched blocks' K chunks (32 f32 rows, 64 half rows) and the
  // AVX-512 prefill prefetch distance, each with a partial last chunk.
  const Shape shapes[] = {{1, 1},    {7, 5},    {16, 64},  {33, 65},
                          {64, 130}, {96, 200}, {300, 70}, {1000, 129}};
  // Every row count through the batched-decode blocks (4..64), both sides of its edges, the
  // few-row decode kernels and the prefill blocks with their tails.
  std::vector<int64_t> row_counts = {1, 2, 3, 65, 66, 97, 104, 200};
  for (int64_t m = 4; m <= 64; ++m) row_counts.push_back(m);
  ThreadPool pool2(2);
  ThreadPool pool3(3);
  for (DType dtype : kDTypes) {
    for (const Shape& s : shapes) {
      const std::vector<float> w = RandomVector(s.k * s.n, 1);
      const std::vector<float> w_rounded = Rounded(w, dtype);
      const std::vector<float> bias = RandomVector(s.n, 2);
      const PackedMatrix packed = PackedMatrix::Pack(w.data(), s.k, s.n, false, dtype);
      ASSERT_EQ(packed.dtype(), dtype);
      for (int64_t m : row_counts) {
        if (s.k >= 300 && m > 16 && m % 8 != 1 && m < 65) continue;  // keep the test quick
        const std::vector<float> a = RandomVector(m * s.k, 3 + m);
        std::vector<float> want(m * s.n);
        MatMulReference(a.data(), m, s.k, w_rounded.data(), s.k, s.n, bias.data(), want.data(),
                        s.n);
        for (MatMulIsa isa : Isas()) {
          SetMatMulIsa(isa);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2, &pool3}) {
            std::vector<float> got(m * s.n, -1.0f);
            MatMul(a.data(), m, s.k, packed, bias.data(), got.data(), s.n, pool);
            ASSERT_EQ(got, want) << "k=" << s.k << " n=" << s.n << " m=" << m
                                 << " isa=" << static_cast<int>(isa)
                                 << " dtype=" << DTypeName(dtype);
          }
        }
      }
    }
  }
}

TEST_F(MatMulTest, Int8EqualsItsScalarTwinForEveryRowCountThreadCountAndIsa) {
  // k = 36 and 1000 end in a partial K block; 300 and 1000 cross the 4-block K chunks; the
  // row counts cover the AVX2 tiles (1, 2), the AVX-512 ones (1-3 whole panel, 4-6 in
  // halves), their near-equal splits up to 64 rows and the prefill tasks past 64 and 96.
  const Shape shapes[] = {{1, 1}, {7, 5}, {36, 64}, {64, 130}, {96, 200}, {300, 70}, {1000, 129}};
  std::vector<int64_t> row_counts = {65, 66, 97, 104, 200};
  for (int64_t m = 1; m <= 64; ++m) row_counts.push_back(m);
  ThreadPool pool2(2);
  ThreadPool pool3(3);
  for (const Shape& s : shapes) {
    const std::vector<float> w = RandomVector(s.k * s.n, 1);
    const Int8Weights q = QuantizeColumns(w, s.k, s.n);
    const std::vector<float> bias = RandomVector(s.n, 2);
    const PackedMatrix packed = PackedMatrix::Pack(w.data(), s.k, s.n, false, DType::kI8);
    ASSERT_EQ(packed.dtype(), DType::kI8);
    for (int64_t m : row_counts) {
      if (s.k >= 300 && m > 16 && m % 8 != 1 && m < 65) continue;  // keep the test quick
      std::vector<float> a = RandomVector(m * s.k, 3 + m);
      if (s.k >= 8) {
        // Row 0 rounds ties (x / scale = 2.5, 3.5, -2.5, 0.5: to even) and holds zeros and
        // the block's extreme.
        const float ties[] = {127.0f, 2.5f, 3.5f, -2.5f, 0.5f, 0.0f, -127.0f, 1.0f};
        std::copy(std::begin(ties), std::end(ties), a.begin());
      }
      std::vector<float> want(m * s.n);
      MatMulReferenceInt8(a.data(), m, s.k, q.q.data(), q.scale.data(), s.k, s.n, bias.data(),
                          want.data(), s.n);
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

TEST_F(MatMulTest, Int8BlocksRoundToTheBlockMaximumOver127) {
  // The scale is max |x| / 127, the extreme maps to +-127, ties go to even, a zero block is
  // all zeros with scale 0, and a short block (n < 32) is rounded on its own.
  const float x[] = {2.54f, -1.27f, 0.01f, 0.03f, 0.05f, 0.0f};
  int8_t q[6];
  const float scale = QuantizeInt8Block(x, 6, q);
  EXPECT_EQ(scale, 2.54f / 127.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], static_cast<int8_t>(std::nearbyint(-1.27f * (127.0f / 2.54f))));
  EXPECT_EQ(q[1], -64);  // -63.5 rounds to even
  EXPECT_EQ(q[5], 0);
  const float zeros[3] = {0.0f, -0.0f, 0.0f};
  int8_t qz[3] = {1, 1, 1};
  EXPECT_EQ(QuantizeInt8Block(zeros, 3, qz), 0.0f);
  EXPECT_EQ(qz[0], 0);
  EXPECT_EQ(qz[1], 0);
  EXPECT_EQ(qz[2], 0);
  // A packed matrix holds exactly those numbers: at() is q * scale of the column's block.
  const int64_t k = 45, n = 70;  // a partial last block, a partial last panel
  const std::vector<float> w = RandomVector(k * n, 4);
  const Int8Weights want = QuantizeColumns(w, k, n);
  const PackedMatrix packed = PackedMatrix::Pack(w.data(), k, n, false, DType::kI8);
  // Two panels of 2 blocks: 2 KiB of bytes and 256 B of scales each.
  EXPECT_EQ(packed.size_bytes(), 2u * 2 * (32 * 64 + 64 * 4));
  int64_t nonzero = 0;
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t nn = 0; nn < n; ++nn) {
      ASSERT_EQ(packed.at(kk, nn),
                static_cast<float>(want.q[kk * n + nn]) * want.scale[kk / kInt8BlockK * n + nn])
          << kk << " " << nn;
      nonzero += packed.at(kk, nn) != 0.0f;
    }
  }
  // Normal weights round to 0 only within half a step (1/254 of the block's maximum) of it.
  EXPECT_GT(nonzero, k * n * 95 / 100);
}

TEST_F(MatMulTest, HalfPrecisionPanelsHoldTheRoundedWeights) {
  // Rounding is to nearest even, and widening back is exact: at() returns the rounded value.
  const int64_t k = 5, n = 70;
  std::vector<float> w = RandomVector(k * n, 4);
  w[0] = 1.0f + 1.0f / 2048;  // halfway between two f16 values: rounds to even (1.0)
  w[1] = 1.0f + 3.0f / 2048;  // halfway: rounds to even (1.0 + 2/1024)
  w[2] = 1.0f + 1.0f / 256;   // halfway between two bf16 values: rounds to even (1.0)
  w[3] = 65536.0f;            // past f16's largest finite value (65504): inf
  const PackedMatrix f16 = PackedMatrix::Pack(w.data(), k, n, false, DType::kF16);
  const PackedMatrix bf16 = PackedMatrix::Pack(w.data(), k, n, false, DType::kBF16);
  EXPECT_EQ(f16.size_bytes() * 2, PackedMatrix::Pack(w.data(), k, n, false).size_bytes());
  EXPECT_EQ(f16.at(0, 0), 1.0f);
  EXPECT_EQ(f16.at(0, 1), 1.0f + 2.0f / 1024);
  EXPECT_EQ(bf16.at(0, 2), 1.0f);
  EXPECT_EQ(f16.at(0, 3), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16.at(0, 3), 65536.0f);
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t nn = 0; nn < n; ++nn) {
      ASSERT_EQ(f16.at(kk, nn), RoundToDType(w[kk * n + nn], DType::kF16));
      ASSERT_EQ(bf16.at(kk, nn), RoundToDType(w[kk * n + nn], DType::kBF16));
      ASSERT_NE(bf16.at(kk, nn), 0.0f);  // nothing lost to a wrong offset
    }
  }
}

TEST_F(MatMulTest, RowResultDoesNotDependOnItsNeighbours) {
  // The same row computed alone (decode path) and at every offset inside a larger batch, up
  // to past the batched-decode blocks' 64 rows.
  const int64_t k = 40, n = 70;
  const std::vector<float> w = RandomVector(k * n, 5);
  const std::vector<float> row = RandomVector(k, 6);
  for (DType dtype : kAllDTypes) {
    const PackedMatrix packed = PackedMatrix::Pack(w.data(), k, n, false, dtype);
    std::vector<float> alone(n);
    SetMatMulIsa(MatMulIsa::kAvx2);
    MatMul(row.data(), 1, k, packed, nullptr, alone.data(), n, nullptr);
    for (MatMulIsa isa : Isas()) {
      SetMatMulIsa(isa);
      for (int64_t m = 1; m <= 70; ++m) {
        for (int64_t at = 0; at<m; at += m> 17 ? 7 : 1) {
          std::vector<float> batch = RandomVector(m * k, 100 + m);
          std::copy(row.begin(), row.end(), batch.begin() + at * k);
          std::vector<float> out(m * n);
          MatMul(batch.data(), m, k, packed, nullptr, out.data(), n, nullptr);
          ASSERT_EQ(std::vector<float>(out.begin() + at * n, out.begin() + (at + 1) * n), alone)
              << "m=" << m << " at=" << at << " isa=" << static_cast<int>(isa)
              << " dtype=" << DTypeName(dtype);
        }
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

TEST_F(MatMulTest, CopyColumnReturnsARowOfATransposedPackAtItsDType) {
  // The CPU backend reads token embeddings this way from the packed (tied) LM head.
  const int64_t k = 9, n = 70;
  const std::vector<float> wt = RandomVector(n * k, 11);  // [n, k]
  for (DType dtype : kAllDTypes) {
    const PackedMatrix packed = PackedMatrix::Pack(wt.data(), k, n, /*transposed=*/true, dtype);
    std::vector<float> column(k);
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, n - 1}) {
      packed.CopyColumn(i, column.data());
      std::vector<float> want(k);
      if (dtype == DType::kI8) {  // the row's one block of 9, rounded on its own
        std::vector<int8_t> q(k);
        const float scale = QuantizeInt8Block(wt.data() + i * k, k, q.data());
        for (int64_t j = 0; j < k; ++j) want[j] = static_cast<float>(q[j]) * scale;
      } else {
        for (int64_t j = 0; j < k; ++j) want[j] = RoundToDType(wt[i * k + j], dtype);
      }
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_EQ(column[j], want[j]) << DTypeName(dtype) << " " << i;
        ASSERT_EQ(column[j], packed.at(j, i));
      }
    }
  }
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

TEST_F(MatMulTest, FusedGeluAndAddToGiveTheBitsOfTheSeparatePasses) {
  // MatMulOutput::kGelu is MatMul then GeluNewInPlace over each row; kAddTo is C + MatMul,
  // element by element: with ==, through every kernel path (few-row decode, batched blocks,
  // prefill blocks), both ISAs, with and without bias, and a last panel of 3 columns (a
  // gelu tail that is not a multiple of 8).
  const int64_t k = 96, n = 131, ldc = 133;
  const std::vector<float> w = RandomVector(k * n, 11);
  const std::vector<float> bias = RandomVector(n, 12);
  const PackedMatrix packed = PackedMatrix::Pack(w.data(), k, n, false);
  ThreadPool pool(2);
  for (int64_t m : {1, 3, 8, 40}) {
    const std::vector<float> a = RandomVector(m * k, 13 + m);
    const std::vector<float> c0 = RandomVector(m * ldc, 20 + m);  // what kAddTo adds to
    for (MatMulIsa isa : Isas()) {
      SetMatMulIsa(isa);
      for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
        std::vector<float> product(m * ldc, 7.0f);
        MatMul(a.data(), m, k, packed, b, product.data(), ldc, &pool);
        std::vector<float> want_gelu = product, want_add = c0;
        for (int64_t r = 0; r < m; ++r) {
          GeluNewInPlace(want_gelu.data() + r * ldc, n);
          for (int64_t j = 0; j < n; ++j) want_add[r * ldc + j] += product[r * ldc + j];
        }
        std::vector<float> gelu(m * ldc, 7.0f), add = c0;
        MatMul(a.data(), m, k, packed, b, gelu.data(), ldc, &pool, MatMulOutput::kGelu);
        MatMul(a.data(), m, k, packed, b, add.data(), ldc, &pool, MatMulOutput::kAddTo);
        ASSERT_EQ(gelu, want_gelu) << "m=" << m << " bias=" << (b != nullptr);
        ASSERT_EQ(add, want_add) << "m=" << m << " bias=" << (b != nullptr);
      }
    }
  }
}

}  // namespace
}  // namespace prefixd
