// The AVX-512 register blocks of MatMul (see matmul_kernels.h): the vector operations that
// matmul_driver.h and matmul_int8.h are instantiated with, and the few-row decode kernel.
// The file is not built with -mavx512f; a target pragma covers only the code after the
// includes instead: a header's inline function compiled here with AVX-512 could otherwise be
// the copy the linker keeps, and crash a CPU without it. (The two templates' headers are
// included under the pragma on purpose: their functions have internal linkage.)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "base/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

// g++ 12's avx512fintrin.h passes _mm512_undefined_*() as the unused merge source of
// unmasked conversions and shifts, which -Wmaybe-uninitialized reports once per use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace prefixd::internal {

// Outside the target: these run on every CPU.
bool CpuHasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return has;
}

bool CpuHasAvx512Vnni() {
  static const bool has =
      CpuHasAvx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  return has;
}

}  // namespace prefixd::internal

#if defined(__clang__)
#pragma clang attribute push( \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,fma,f16c")
#endif

#include "kernels/cpu/matmul_driver.h"
#include "kernels/cpu/matmul_int8.h"

namespace prefixd::internal {
namespace {

// The float blocks' vector operations (matmul_driver.h) on 16 lanes.
struct Avx512 {
  using V = __m512;
  static constexpr int kLanes = 16;
  // Sixteen panel elements as fp32, exactly (fp16 and bf16 widen without rounding). `p` is
  // 32-byte aligned for the half types, 64-byte for f32.
  template <DType D>
  static V Load(const PanelElem<D>* p) {
    if constexpr (D == DType::kF32) {
      return _mm512_load_ps(p);
    } else if constexpr (D == DType::kF16) {
      return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
    } else {
      const __m512i wide =
          _mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
      return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
    }
  }
  static V Broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static V Zero() { return _mm512_setzero_ps(); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V LoadAligned(const float* p) { return _mm512_load_ps(p); }
  static void StoreAligned(float* p, V v) { _mm512_store_ps(p, v); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }

  // Into L2 (T1): measured a little better than T0 for decode and no worse for prefill.
  static constexpr int kPrefetchHint = _MM_HINT_T1;
  // Two k per loop trip (the loop's own instructions were measurable next to 24 FMAs).
  static constexpr int kRowsUnroll = 2;
  static constexpr int kMaxRows = kMaxRowsAvx512;
  // Up to 6 rows hold the full 64 columns in 4R of the 32 zmm registers; 7 and 8 rows take
  // the panel in two 32-column halves.
  static constexpr int RowsVectors(int rows) { return rows <= 6 ? 4 : 2; }
  // Panel rows this far ahead are prefetched by a task's first row block (the panel is not in
  // cache yet; later blocks find it in L2, where the prefetches only cost issue slots, ≈5 % of
  // the kernel's rate): 16 KiB ahead in f32. (A prefetch past the end of the panel, or of
  // the allocation, is harmless: it never faults.)
  template <DType D>
  static constexpr int64_t RowsPrefetch(int, bool prefetch) {
    return prefetch ? 64 : 0;
  }
  // 6 rows x 4 zmm: the whole panel row in one tile.
  static constexpr int BatchTileVectors(int) { return 4; }
};

// The few-row (decode) kernel walks two panels at once, each prefetched this many rows
// ahead: a short distance, since the two streams' prefetches together already fill the
// core's queue of outstanding misses (longer distances measured slower).
// Kept in bytes across dtypes (8 rows of halves): measured ≈3 % faster for f16 than 4 rows.
constexpr int64_t kFewRowsPrefetchRows = 4;  // 1 KiB ahead in f32

// R rows against S consecutive panels, each panel its own stream (see PanelsFewRowsAvx512);
// R x S x 4 accumulators.
template <DType D, int R, int S>
void FewRows(const float* a, int64_t lda, const void* data, int64_t k, float* out) {
  const PanelElem<D>* panel = static_cast<const PanelElem<D>*>(data);
  const int64_t panel_stride = k * kPanelWidth;
  constexpr int64_t kFewRowsDistance =
      kFewRowsPrefetchRows * int64_t{sizeof(float)} / int64_t{sizeof(PanelElem<D>)};
  __m512 acc[S][R][4];
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < 4; ++v) acc[s][r][v] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      MicroStep<Avx512, D, R, 4, kFewRowsDistance>(a, lda, panel + s * panel_stride, kk, acc[s]);
    }
  }
#pragma GCC unroll 16
  for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < 4; ++v) {
        _mm512_store_ps(out + (s * R + r) * kPanelWidth + 16 * v, acc[s][r][v]);
      }
}

template <DType D>
void FewRowsFor(const float* a, int64_t lda, int64_t rows, const void* data, int64_t num_panels,
                int64_t k, float* out) {
  switch (rows * 2 + num_panels - 1) {
    case 2:
      return FewRows<D, 1, 1>(a, lda, data, k, out);
    case 3:
      return FewRows<D, 1, 2>(a, lda, data, k, out);
    case 4:
      return FewRows<D, 2, 1>(a, lda, data, k, out);
    case 5:
      return FewRows<D, 2, 2>(a, lda, data, k, out);
    case 6:
      return FewRows<D, 3, 1>(a, lda, data, k, out);
    case 7:
      return FewRows<D, 3, 2>(a, lda, data, k, out);
  }
  PREFIXD_CHECK(false);
}

// vpdpbusd multiplies unsigned by signed bytes and adds each group of 4 into an int32 lane
// without saturation: the panel's bytes (qw + 128) are the unsigned operand and the row's qa
// the signed one, so each lane gets sum (qw + 128) qa, and starting the lane from -128 x (the
// row block's sum of qa) leaves exactly sum qw qa.
struct Avx512VnniInt8 {
  using I = __m512i;
  using F = __m512;
  using W = __m512i;
  using A = __m512i;
  static constexpr int kLanes = 16;
  // 32 zmm: up to 3 rows take the whole panel (4 vectors: 3 x 4 integer and 3 x 4 float
  // accumulators, 4 weight vectors, a broadcast); 4 to 6 rows take it in halves.
  static constexpr int kMaxTileRows = 6;
  static constexpr int Tile(int rows) { return rows <= 3 ? 4 : 2; }
  static W Weights(const uint8_t* p) { return _mm512_load_si512(p); }
  static A Acts(const int8_t* p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm512_set1_epi32(x);
  }
  static I Init(int32_t sum) { return _mm512_set1_epi32(-128 * sum); }
  static I Dot(I acc, W w, A a) { return _mm512_dpbusd_epi32(acc, w, a); }
  static F ToFloat(I x) { return _mm512_cvtepi32_ps(x); }
  static F FLoad(const float* p) { return _mm512_load_ps(p); }
  static void FStore(float* p, F x) { _mm512_store_ps(p, x); }
  static F FZero() { return _mm512_setzero_ps(); }
  static F FSet1(float x) { return _mm512_set1_ps(x); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
};

}  // namespace

void PanelsFewRowsAvx512(const float* a, int64_t lda, int64_t rows, PanelRef panel,
                         int64_t num_panels, float* out) {
  PREFIXD_CHECK(num_panels == 1 || num_panels == 2);
  switch (panel.dtype) {
    case DType::kF32:
      return FewRowsFor<DType::kF32>(a, lda, rows, panel.data, num_panels, panel.k, out);
    case DType::kF16:
      return FewRowsFor<DType::kF16>(a, lda, rows, panel.data, num_panels, panel.k, out);
    case DType::kBF16:
      return FewRowsFor<DType::kBF16>(a, lda, rows, panel.data, num_panels, panel.k, out);
    case DType::kI8:  // PanelInt8Avx512
      break;
  }
  PREFIXD_CHECK(false);
}

void PanelRowsAvx512(const float* a, int64_t rows, int64_t lda, PanelRef panel, bool prefetch,
                     float* out) {
  switch (panel.dtype) {
    case DType::kF32:
      return prefetch ? Rows<Avx512, DType::kF32, true>(a, rows, lda, panel.data, panel.k, out)
                      : Rows<Avx512, DType::kF32, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return prefetch ? Rows<Avx512, DType::kF16, true>(a, rows, lda, panel.data, panel.k, out)
                      : Rows<Avx512, DType::kF16, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return prefetch ? Rows<Avx512, DType::kBF16, true>(a, rows, lda, panel.data, panel.k, out)
                      : Rows<Avx512, DType::kBF16, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kI8:  // PanelInt8Avx512
      break;
  }
  PREFIXD_CHECK(false);
}

void PanelBatchAvx512(const float* a, int64_t rows, int64_t lda, PanelRef panel, float* out) {
  PREFIXD_CHECK(rows >= 1 && rows <= kMaxBatchRows);
  switch (panel.dtype) {
    case DType::kF32:
      return Batch<Avx512, DType::kF32>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return Batch<Avx512, DType::kF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return Batch<Avx512, DType::kBF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kI8:  // PanelInt8Avx512
      break;
  }
  PREFIXD_CHECK(false);
}

void PanelInt8Avx512(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out) {
  PREFIXD_CHECK(panel.dtype == DType::kI8 && rows >= 1 && rows <= kMaxBatchRows);
  Int8Panel<Avx512VnniInt8>(a, row0, rows, panel.data, (panel.k + kInt8BlockK - 1) / kInt8BlockK,
                            out);
}

}  // namespace prefixd::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
