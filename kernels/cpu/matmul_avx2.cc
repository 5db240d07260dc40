// The AVX2 + FMA + F16C register blocks of MatMul (see matmul_kernels.h): the vector
// operations that matmul_driver.h and matmul_int8.h are instantiated with. This library is
// built for x86-64-v3, so these need no target attributes. The templates' loops over rows and
// vectors are unrolled completely (#pragma GCC unroll), so that g++ keeps each accumulator in
// a register: left to itself it kept some blocks' accumulators in memory and stored them
// every k (half the kernel's rate).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_driver.h"
#include "kernels/cpu/matmul_int8.h"
#include "kernels/cpu/matmul_kernels.h"

namespace prefixd::internal {
namespace {

// Panel rows the single-row block prefetches ahead, counted in f32 rows (a half-precision
// panel goes twice as many rows ahead: the same bytes).
constexpr int64_t kDecodePrefetchRows = 16;

// The float blocks' vector operations (matmul_driver.h) on 8 lanes.
struct Avx2 {
  using V = __m256;
  static constexpr int kLanes = 8;
  // Eight panel elements as fp32, exactly (fp16 and bf16 widen without rounding). `p` is
  // 16-byte aligned for the half types, 32-byte for f32.
  template <DType D>
  static V Load(const PanelElem<D>* p) {
    if constexpr (D == DType::kF32) {
      return _mm256_load_ps(p);
    } else if constexpr (D == DType::kF16) {
      return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
    } else {
      const __m256i wide =
          _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    }
  }
  static V Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V Zero() { return _mm256_setzero_ps(); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V LoadAligned(const float* p) { return _mm256_load_ps(p); }
  static void StoreAligned(float* p, V v) { _mm256_store_ps(p, v); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }

  static constexpr int kPrefetchHint = _MM_HINT_T0;
  static constexpr int kRowsUnroll = 1;
  static constexpr int kMaxRows = kMaxRowsAvx2;
  // Register budget (16 ymm): R x NV accumulators + NV panel loads + 1 broadcast.
  static constexpr int RowsVectors(int rows) { return rows == 1 ? 8 : rows == 2 ? 4 : 2; }
  // One row is a decode step's stream of the weights from memory: prefetch ahead. (AVX2 has
  // no few-row kernel, so its one-row block is the decode stream whatever the caller says.)
  template <DType D>
  static constexpr int64_t RowsPrefetch(int rows, bool) {
    return rows == 1 ? kDecodePrefetchRows * int64_t{sizeof(float)} / int64_t{sizeof(PanelElem<D>)}
                     : 0;
  }
  // As many accumulators as the 16 ymm registers hold next to the tile's panel loads and a
  // broadcast (R x NV + NV + 1 <= 16), and at least 8 of them where R allows, so that the
  // FMAs' latency (4 cycles, 2 ports) is hidden: 2 rows x 4 vectors, 3 x 3, 4 x 3 (12), 5 x 2,
  // 6 x 2 (12). With NV = 3 the panel's 8 vectors go as 3 + 3 + 2.
  static constexpr int BatchTileVectors(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 3 : 2; }
};

// ---- int8 ----

// The int8 products in AVX2 (no VNNI): vpmaddubsw multiplies unsigned by signed bytes and
// adds pairs into int16 with saturation, so both factors are kept within [-127, 127] in
// magnitude (|a| times w with a's sign moved onto it, vpsignb): a pair is at most
// 2 x 127 x 127 = 32,258, never saturating, and the sums are exact.
struct Avx2Int8 {
  using I = __m256i;
  using F = __m256;
  using W = __m256i;
  struct A {
    __m256i abs;   // |qa| as unsigned bytes
    __m256i sign;  // qa
  };
  static constexpr int kLanes = 8;
  // 16 ymm: 2 x 2 integer and 2 x 2 float accumulators, 2 weight vectors, the activations'
  // two forms and the constant of ones. (Measured against 1 x 4 for a row alone: no better.)
  static constexpr int kMaxTileRows = 2;
  static constexpr int Tile(int) { return 2; }
  static W Weights(const uint8_t* p) {
    return _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static A Acts(const int8_t* p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    const __m256i b = _mm256_set1_epi32(x);
    return {_mm256_abs_epi8(b), b};
  }
  static I Init(int32_t) { return _mm256_setzero_si256(); }
  static I Dot(I acc, W w, A a) {
    const __m256i pairs = _mm256_maddubs_epi16(a.abs, _mm256_sign_epi8(w, a.sign));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
  static F ToFloat(I x) { return _mm256_cvtepi32_ps(x); }
  static F FLoad(const float* p) { return _mm256_load_ps(p); }
  static void FStore(float* p, F x) { _mm256_store_ps(p, x); }
  static F FZero() { return _mm256_setzero_ps(); }
  static F FSet1(float x) { return _mm256_set1_ps(x); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
};

}  // namespace

void PanelInt8Avx2(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out) {
  PREFIXD_CHECK(panel.dtype == DType::kI8 && rows >= 1 && rows <= kMaxBatchRows);
  Int8Panel<Avx2Int8>(a, row0, rows, panel.data, (panel.k + kInt8BlockK - 1) / kInt8BlockK, out);
}

void PanelRowsAvx2(const float* a, int64_t rows, int64_t lda, PanelRef panel, float* out) {
  switch (panel.dtype) {
    case DType::kF32:
      return Rows<Avx2, DType::kF32, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return Rows<Avx2, DType::kF16, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return Rows<Avx2, DType::kBF16, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kI8:  // PanelInt8Avx2
      break;
  }
  PREFIXD_CHECK(false);
}

void PanelBatchAvx2(const float* a, int64_t rows, int64_t lda, PanelRef panel, float* out) {
  PREFIXD_CHECK(rows >= 1 && rows <= kMaxBatchRows);
  switch (panel.dtype) {
    case DType::kF32:
      return Batch<Avx2, DType::kF32>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return Batch<Avx2, DType::kF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return Batch<Avx2, DType::kBF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kI8:  // PanelInt8Avx2
      break;
  }
  PREFIXD_CHECK(false);
}

}  // namespace prefixd::internal
