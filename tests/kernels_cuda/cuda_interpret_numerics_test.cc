// The CUDA interpreter's numerics (kernels/cuda/interpret), checked against what CUDA
// specifies: half/bf16 conversions round bit for bit as CUDA's (and agree with the engine's own
// conversions); cublasGemmEx has cuBLAS's column-major semantics and argument checks. Its
// device side is checked in cuda_interpret_device_test.cc, its runtime in
// cuda_interpret_runtime_test.cc.
//
// Built only in an interpret build (tests/kernels_cuda/CMakeLists.txt): cuda_fp16.h,
// cuda_bf16.h and cublas_v2.h are the interpreter's, and it asks the interpreter for counters.
#ifndef PREFIXD_CUDA_INTERPRET
#error "this test checks the CUDA interpreter: build with -DPREFIXD_CUDA_INTERPRET=ON"
#endif

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/interpret/interpret.h"
#include "tests/kernels_cuda/cuda_test_util.h"

namespace prefixd {
namespace {

using cuda_test::DeviceBuffer;

// ---- 1. half and bfloat16 -------------------------------------------------------------------

uint16_t HalfBits(float f) { return __float2half_rn(f).__x; }
uint16_t BF16Bits(float f) { return __float2bfloat16_rn(f).__x; }

TEST(CudaInterpretHalfTest, ConversionsRoundAsCudas) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(HalfBits(1.0f), 0x3c00);
  EXPECT_EQ(HalfBits(-2.5f), 0xc100);
  EXPECT_EQ(HalfBits(0.0f), 0x0000);
  EXPECT_EQ(HalfBits(-0.0f), 0x8000);
  EXPECT_EQ(HalfBits(65504.0f), 0x7bff);   // the largest half
  EXPECT_EQ(HalfBits(65519.99f), 0x7bff);  // just below the midpoint to infinity
  EXPECT_EQ(HalfBits(65520.0f), 0x7c00);   // the midpoint: rounds (to even) to infinity
  EXPECT_EQ(HalfBits(-65520.0f), 0xfc00);
  EXPECT_EQ(HalfBits(inf), 0x7c00);
  EXPECT_EQ(HalfBits(-inf), 0xfc00);
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -25)), 0x0000);  // a tie: to the even zero
  EXPECT_EQ(HalfBits(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(HalfBits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(HalfBits(3 * std::ldexp(1.0f, -25)), 0x0002);  // a tie: to the even 2
  EXPECT_EQ(HalfBits(5 * std::ldexp(1.0f, -25)), 0x0002);  // a tie: to the even 2
  // The largest subnormal's midpoint to the smallest normal: a tie, to the even 0x0400.
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);
  EXPECT_EQ(HalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even
  EXPECT_EQ(HalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, even
  EXPECT_EQ(HalfBits(nan), 0x7fff);
  EXPECT_EQ(HalfBits(-nan), 0x7fff);

  EXPECT_EQ(BF16Bits(1.0f), 0x3f80);
  EXPECT_EQ(BF16Bits(-2.5f), 0xc020);
  EXPECT_EQ(BF16Bits(1.00390625f), 0x3f80);  // 1 + 2^-8, a tie: to even
  EXPECT_EQ(BF16Bits(1.01171875f), 0x3f82);  // 1 + 3 * 2^-8, a tie: to even
  EXPECT_EQ(BF16Bits(std::nextafter(1.00390625f, 2.0f)), 0x3f81);
  EXPECT_EQ(BF16Bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(BF16Bits(-inf), 0xff80);
  EXPECT_EQ(BF16Bits(nan), 0x7fff);
  EXPECT_EQ(BF16Bits(-nan), 0x7fff);
  EXPECT_EQ(__bfloat162float(__nv_bfloat16{0x3f81}), 1.0078125f);
}

TEST(CudaInterpretHalfTest, EveryHalfDecodesExactlyAndRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = __half2float(__half{bits});
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 0x1f && mant != 0) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(HalfBits(f), 0x7fff) << std::hex << h;
      continue;
    }
    const double want = exp == 0x1f ? sign * std::numeric_limits<double>::infinity()
                        : exp == 0  ? sign * std::ldexp(mant, -24)
                                    : sign * std::ldexp(1024 + mant, exp - 25);
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    ASSERT_EQ(HalfBits(f), bits) << std::hex << h;
  }
}

TEST(CudaInterpretHalfTest, AgreesWithTheEnginesConversionsOnFiniteFloats) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<uint32_t> bits;
  // Half the draws near the half range (exponents 2^-27 .. 2^17), the rest anywhere.
  std::uniform_int_distribution<uint32_t> near_exp(100, 144);
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t u = bits(rng);
    if (i % 2 == 0) u = (u & 0x807fffffu) | (near_exp(rng) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(HalfBits(f), FloatToHalf(f)) << std::hexfloat << f;
    ASSERT_EQ(BF16Bits(f), FloatToBF16(f)) << std::hexfloat << f;
    ASSERT_EQ(__half2float(__half{HalfBits(f)}), HalfToFloat(HalfBits(f))) << std::hexfloat << f;
  }
}

// ---- 2. cublasGemmEx ------------------------------------------------------------------------

// A column-major rows x cols matrix with leading dimension ld in dtype t; the padding rows
// hold NaN, so a product that read them would show it.
struct Matrix {
  int rows, cols, ld;
  std::vector<float> values;  // [cols, ld], dtype-rounded, NaN in the padding
};

Matrix RandomMatrix(int rows, int cols, int ld, DType t, std::mt19937* rng) {
  Matrix m{
      rows, cols, ld,
      std::vector<float>(static_cast<size_t>(ld) * cols, std::numeric_limits<float>::quiet_NaN())};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) m.values[static_cast<size_t>(c) * ld + r] = dist(*rng);
  }
  m.values = cuda_test::Round(m.values, t);
  return m;
}

cudaDataType CudaType(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : t == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
}

class CudaInterpretGemmTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS); }
  void TearDown() override { cublasDestroy(handle_); }
  cublasHandle_t handle_ = nullptr;
};

TEST_F(CudaInterpretGemmTest, MatchesADoubleReferenceForEveryOpAndDtype) {
  constexpr int kM = 5, kN = 4, kK = 7, kLdc = kM + 2;
  std::mt19937 rng(7);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
        for (float beta : {-1.25f, 0.0f}) {
          SCOPED_TRACE(absl::StrCat(std::string(DTypeName(t)), " op(A) ",
                                    ta == CUBLAS_OP_T ? "T" : "N", " op(B) ",
                                    tb == CUBLAS_OP_T ? "T" : "N", " beta ", beta));
          const bool a_t = ta == CUBLAS_OP_T, b_t = tb == CUBLAS_OP_T;
          const int a_rows = a_t ? kK : kM, a_cols = a_t ? kM : kK;
          const int b_rows = b_t ? kN : kK, b_cols = b_t ? kK : kN;
          const Matrix a = RandomMatrix(a_rows, a_cols, a_rows + 3, t, &rng);
          const Matrix b = RandomMatrix(b_rows, b_cols, b_rows + 1, t, &rng);
          // C's padding holds a sentinel the product must leave alone; with beta = 0 its
          // values are NaN, which cuBLAS does not read.
          std::vector<float> c(static_cast<size_t>(kLdc) * kN, 4242.0f);
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          for (int j = 0; j < kN; ++j) {
            for (int i = 0; i < kM; ++i) {
              c[j * kLdc + i] = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
            }
          }
          DeviceBuffer d_a(cuda_test::Encode(a.values, t)), d_b(cuda_test::Encode(b.values, t));
          DeviceBuffer d_c(c);
          ASSERT_TRUE(d_a.ok() && d_b.ok() && d_c.ok());
          const float alpha = 0.75f;
          ASSERT_EQ(cublasGemmEx(handle_, ta, tb, kM, kN, kK, &alpha, d_a.get(), CudaType(t), a.ld,
                                 d_b.get(), CudaType(t), b.ld, &beta, d_c.get(), CUDA_R_32F, kLdc,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    CUBLAS_STATUS_SUCCESS);
          const std::vector<float> got = d_c.Download<float>();
          for (int j = 0; j < kN; ++j) {
            for (int i = 0; i < kLdc; ++i) {
              const size_t at = static_cast<size_t>(j) * kLdc + i;
              if (i >= kM) {
                EXPECT_EQ(got[at], 4242.0f) << "C padding row " << i << " col " << j;
                continue;
              }
              double want = 0;
              for (int l = 0; l < kK; ++l) {
                const double av = a_t ? a.values[i * a.ld + l] : a.values[l * a.ld + i];
                const double bv = b_t ? b.values[l * b.ld + j] : b.values[j * b.ld + l];
                want += av * bv;
              }
              want = alpha * want + (beta == 0.0f ? 0.0 : beta * static_cast<double>(c[at]));
              // f16 and bf16 products are exact in fp32: only fp32 accumulation of 7 terms
              // of magnitude <= 1 (plus beta * C) rounds, well inside 1e-5.
              EXPECT_NEAR(got[at], want, 1e-5 + 1e-5 * std::fabs(want))
                  << "C(" << i << ", " << j << ")";
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaInterpretGemmTest, KZeroScalesCByBeta) {
  std::vector<float> c = {1.0f, -2.0f, 3.0f, 4.0f};
  DeviceBuffer d_a(sizeof(float)), d_b(sizeof(float)), d_c(c);
  ASSERT_TRUE(d_a.ok() && d_b.ok() && d_c.ok());
  const float alpha = 1.0f, beta = 0.5f;
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 0, &alpha, d_a.get(), CUDA_R_32F,
                         2, d_b.get(), CUDA_R_32F, 1, &beta, d_c.get(), CUDA_R_32F, 2,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(d_c.Download<float>(), (std::vector<float>{0.5f, -1.0f, 1.5f, 2.0f}));
}

TEST_F(CudaInterpretGemmTest, BadArgumentsAreRefusedAndLeaveCAlone) {
  constexpr int kM = 5, kN = 4, kK = 7;
  const std::vector<float> c(kM * kN, 9.0f);
  DeviceBuffer d_a(64 * 64 * sizeof(float)), d_b(64 * 64 * sizeof(float)), d_c(c);
  ASSERT_TRUE(d_a.ok() && d_b.ok() && d_c.ok());
  const float alpha = 1.0f, beta = 1.0f;
  struct Case {
    const char* what;
    cublasOperation_t ta, tb;
    int lda, ldb, ldc;
    cudaDataType a_type, b_type, c_type;
    cublasStatus_t want;
  };
  const Case kCases[] = {
      {"lda < m (A not transposed)", CUBLAS_OP_N, CUBLAS_OP_N, kM - 1, kK, kM, CUDA_R_32F,
       CUDA_R_32F, CUDA_R_32F, CUBLAS_STATUS_INVALID_VALUE},
      {"lda < k (A transposed), though >= m", CUBLAS_OP_T, CUBLAS_OP_N, kM, kK, kM, CUDA_R_32F,
       CUDA_R_32F, CUDA_R_32F, CUBLAS_STATUS_INVALID_VALUE},
      {"ldb < k (B not transposed)", CUBLAS_OP_N, CUBLAS_OP_N, kM, kK - 1, kM, CUDA_R_32F,
       CUDA_R_32F, CUDA_R_32F, CUBLAS_STATUS_INVALID_VALUE},
      {"ldb < n (B transposed)", CUBLAS_OP_N, CUBLAS_OP_T, kM, kN - 1, kM, CUDA_R_32F, CUDA_R_32F,
       CUDA_R_32F, CUBLAS_STATUS_INVALID_VALUE},
      {"ldc < m", CUBLAS_OP_N, CUBLAS_OP_N, kM, kK, kM - 1, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
       CUBLAS_STATUS_INVALID_VALUE},
      {"A f16, B bf16", CUBLAS_OP_N, CUBLAS_OP_N, kM, kK, kM, CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F,
       CUBLAS_STATUS_NOT_SUPPORTED},
      {"A, B f32, C f16", CUBLAS_OP_N, CUBLAS_OP_N, kM, kK, kM, CUDA_R_32F, CUDA_R_32F, CUDA_R_16F,
       CUBLAS_STATUS_NOT_SUPPORTED},
  };
  const int64_t gemms = cuda_interpret::GetCounters().gemms;
  for (const Case& k : kCases) {
    SCOPED_TRACE(k.what);
    EXPECT_EQ(cublasGemmEx(handle_, k.ta, k.tb, kM, kN, kK, &alpha, d_a.get(), k.a_type, k.lda,
                           d_b.get(), k.b_type, k.ldb, &beta, d_c.get(), k.c_type, k.ldc,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              k.want);
  }
  EXPECT_EQ(cuda_interpret::GetCounters().gemms, gemms);
  EXPECT_EQ(d_c.Download<float>(), c);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cuBLAS argument errors are not CUDA errors
}

}  // namespace
}  // namespace prefixd
