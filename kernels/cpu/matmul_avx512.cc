// The AVX-512 register blocks of MatMul (see matmul_kernels.h). Every function here carries
// the target attribute instead of the file being built with -mavx512f: a header's inline
// function compiled here with AVX-512 could otherwise be the copy the linker keeps, and crash
// a CPU without it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

// g++ 12's avx512fintrin.h passes _mm512_undefined_*() as the unused merge source of
// unmasked conversions and shifts, which -Wmaybe-uninitialized reports once per use.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define PREFIXD_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,fma,f16c")))

// Register-block loops over rows, vectors and panels are unrolled completely (#pragma GCC
// unroll), so that g++ keeps each accumulator in a register.

namespace prefixd::internal {
namespace {

// Panel rows this far ahead are prefetched: a decode step streams each panel from memory
// once, and the hardware prefetcher alone leaves the single-row kernel waiting on DRAM. (A
// prefetch past the end of the panel, or of the allocation, is harmless: it never faults.)
// Into L2 (T1): measured a little better than T0 for decode and no worse for prefill.
constexpr int64_t kPrefetchRows = 64;  // 16 KiB ahead in f32
// The few-row (decode) kernel walks two panels at once, each prefetched this many rows
// ahead: a short distance, since the two streams' prefetches together already fill the
// core's queue of outstanding misses (longer distances measured slower).
// Kept in bytes across dtypes (8 rows of halves): measured ≈3 % faster for f16 than 4 rows.
constexpr int64_t kFewRowsPrefetchRows = 4;  // 1 KiB ahead in f32

// Sixteen panel elements as fp32, exactly (fp16 and bf16 widen without rounding). `p` is
// 32-byte aligned for the half types, 64-byte for f32.
template <DType D>
struct Load16;
template <>
struct Load16<DType::kF32> {
  using T = float;
  PREFIXD_TARGET_AVX512 static __m512 At(const float* p) { return _mm512_load_ps(p); }
};
template <>
struct Load16<DType::kF16> {
  using T = uint16_t;
  PREFIXD_TARGET_AVX512 static __m512 At(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  }
};
template <>
struct Load16<DType::kBF16> {
  using T = uint16_t;
  PREFIXD_TARGET_AVX512 static __m512 At(const uint16_t* p) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
};

template <DType D>
using Elem = typename Load16<D>::T;

// One k of Micro and FewRows below: acc[r][v] += a[r, kk] * p[kk, 16 v + c], after
// prefetching the panel row kDistance rows ahead (0: no prefetch), once per cache line.
template <DType D, int R, int NV, int64_t kDistance>
PREFIXD_TARGET_AVX512 __attribute__((always_inline)) inline void MicroStep(
    const float* a, int64_t lda, const Elem<D>* p, int64_t kk, __m512 (&acc)[R][NV]) {
  const Elem<D>* prow = p + kk * kPanelWidth;
  if constexpr (kDistance > 0) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      if ((16 * v * sizeof(Elem<D>)) % 64 != 0) continue;
      _mm_prefetch(reinterpret_cast<const char*>(prow + kDistance * kPanelWidth + 16 * v),
                   _MM_HINT_T1);
    }
  }
  __m512 b[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) b[v] = Load16<D>::At(prow + 16 * v);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512 av = _mm512_set1_ps(a[r * lda + kk]);
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, b[v], acc[r][v]);
  }
}

// acc[r][v] = sum_k a[r, k] * p[k, 16 v + c], one fma chain per element, K in order, for R
// rows and NV*16 columns starting at `p` (row stride kPanelWidth). Two k per loop trip (the
// loop's own instructions were measurable next to 24 FMAs). kPrefetch: the panel is not yet
// in cache (the first row block of a task); later blocks find it in L2, where the prefetches
// only cost issue slots (measured ≈5 % of the kernel's rate).
template <DType D, int R, int NV, bool kPrefetch>
PREFIXD_TARGET_AVX512 inline void Micro(const float* a, int64_t lda, const Elem<D>* p, int64_t k,
                                        float* out) {
  __m512 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  constexpr int64_t kDistance = kPrefetch ? kPrefetchRows : 0;
  int64_t kk = 0;
  for (; kk + 2 <= k; kk += 2) {
    MicroStep<D, R, NV, kDistance>(a, lda, p, kk, acc);
    MicroStep<D, R, NV, kDistance>(a, lda, p, kk + 1, acc);
  }
  if (kk < k) MicroStep<D, R, NV, kDistance>(a, lda, p, kk, acc);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_store_ps(out + r * kPanelWidth + 16 * v, acc[r][v]);
}

// R rows of one whole panel. Up to 6 rows hold the full 64 columns in 4R of the 32 zmm
// registers; 7 and 8 rows take the panel in two 32-column halves (each half touches its own
// cache lines of every panel row, so the panel still comes from memory once).
template <DType D, int R, bool kPrefetch>
PREFIXD_TARGET_AVX512 void Block(const float* a, int64_t lda, const Elem<D>* panel, int64_t k,
                                 float* out) {
  if constexpr (R <= 6) {
    Micro<D, R, 4, kPrefetch>(a, lda, panel, k, out);
  } else {
    Micro<D, R, 2, kPrefetch>(a, lda, panel, k, out);
    Micro<D, R, 2, kPrefetch>(a, lda, panel + 32, k, out + 32);
  }
}

template <DType D, bool kPrefetch>
PREFIXD_TARGET_AVX512 void Rows(const float* a, int64_t rows, int64_t lda, const void* data,
                                int64_t k, float* out) {
  const Elem<D>* panel = static_cast<const Elem<D>*>(data);
  switch (rows) {
    case 1:
      return Block<D, 1, kPrefetch>(a, lda, panel, k, out);
    case 2:
      return Block<D, 2, kPrefetch>(a, lda, panel, k, out);
    case 3:
      return Block<D, 3, kPrefetch>(a, lda, panel, k, out);
    case 4:
      return Block<D, 4, kPrefetch>(a, lda, panel, k, out);
    case 5:
      return Block<D, 5, kPrefetch>(a, lda, panel, k, out);
    case 6:
      return Block<D, 6, kPrefetch>(a, lda, panel, k, out);
    case 7:
      return Block<D, 7, kPrefetch>(a, lda, panel, k, out);
    case 8:
      return Block<D, 8, kPrefetch>(a, lda, panel, k, out);
  }
  PREFIXD_CHECK(false);
}

// R rows against S consecutive panels, each panel its own stream (see PanelsFewRowsAvx512);
// R x S x 4 accumulators.
template <DType D, int R, int S>
PREFIXD_TARGET_AVX512 void FewRows(const float* a, int64_t lda, const void* data, int64_t k,
                                   float* out) {
  const Elem<D>* panel = static_cast<const Elem<D>*>(data);
  const int64_t panel_stride = k * kPanelWidth;
  constexpr int64_t kFewRowsDistance = kFewRowsPrefetchRows * sizeof(float) / sizeof(Elem<D>);
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
      MicroStep<D, R, 4, kFewRowsDistance>(a, lda, panel + s * panel_stride, kk, acc[s]);
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
PREFIXD_TARGET_AVX512 void FewRowsFor(const float* a, int64_t lda, int64_t rows, const void* data,
                                      int64_t num_panels, int64_t k, float* out) {
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

// ---- Batched decode ----

// Panel bytes per K chunk: the chunk being multiplied and the one being prefetched both fit
// a 32 KiB L1 next to the rows' inputs.
constexpr int64_t kBatchChunkBytes = 8 << 10;
// Up to 6 rows x 4 zmm (the whole 64-column panel row): 24 accumulators, 4 panel loads and a
// broadcast of the 32 registers.
constexpr int kMaxBatchTileRows = 6;

// out[r, 0..64) continues its fma chains over panel rows [k0, k1) for R rows: from +0.0f
// when k0 == 0, else from the partial sums stored there; one step of `prefetch` per k.
template <DType D, int R>
PREFIXD_TARGET_AVX512 __attribute__((always_inline)) inline void BatchTile(
    const float* a, int64_t lda, const Elem<D>* p, int64_t k0, int64_t k1, PrefetchSpread& prefetch,
    float* out) {
  __m512 acc[R][4];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < 4; ++v) {
      acc[r][v] = k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(out + r * kPanelWidth + 16 * v);
    }
  }
  // A local copy: through the reference its counters went to memory every k, a store-to-load
  // chain longer than the k step's arithmetic.
  PrefetchSpread spread = prefetch;
  for (int64_t kk = k0; kk < k1; ++kk) {
    const Elem<D>* prow = p + kk * kPanelWidth;
    spread.Step();
    __m512 b[4];
#pragma GCC unroll 16
    for (int v = 0; v < 4; ++v) b[v] = Load16<D>::At(prow + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + kk]);
#pragma GCC unroll 16
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_fmadd_ps(av, b[v], acc[r][v]);
    }
  }
  prefetch = spread;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < 4; ++v) _mm512_store_ps(out + r * kPanelWidth + 16 * v, acc[r][v]);
}

template <DType D>
PREFIXD_TARGET_AVX512 void BatchTileRows(const float* a, int64_t rows, int64_t lda,
                                         const Elem<D>* p, int64_t k0, int64_t k1,
                                         PrefetchSpread& prefetch, float* out) {
  switch (rows) {
    case 1:
      return BatchTile<D, 1>(a, lda, p, k0, k1, prefetch, out);
    case 2:
      return BatchTile<D, 2>(a, lda, p, k0, k1, prefetch, out);
    case 3:
      return BatchTile<D, 3>(a, lda, p, k0, k1, prefetch, out);
    case 4:
      return BatchTile<D, 4>(a, lda, p, k0, k1, prefetch, out);
    case 5:
      return BatchTile<D, 5>(a, lda, p, k0, k1, prefetch, out);
    case 6:
      return BatchTile<D, 6>(a, lda, p, k0, k1, prefetch, out);
  }
  PREFIXD_CHECK(false);
}

template <DType D>
PREFIXD_TARGET_AVX512 void Batch(const float* a, int64_t rows, int64_t lda, const void* data,
                                 int64_t k, float* out) {
  const Elem<D>* panel = static_cast<const Elem<D>*>(data);
  constexpr int64_t kChunk = kBatchChunkBytes / (kPanelWidth * sizeof(Elem<D>));
  // Row blocks of near-equal size (8 rows: 4 + 4, not 6 + 2).
  const int64_t blocks = (rows + kMaxBatchTileRows - 1) / kMaxBatchTileRows;
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t k1 = std::min(k, k0 + kChunk);
    PrefetchSpread prefetch = ChunkPrefetch<PrefetchFarChunk(D)>(
        panel, kPanelWidth * sizeof(Elem<D>), k, k1, kChunk, (k1 - k0) * blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = rows * b / blocks, r1 = rows * (b + 1) / blocks;
      BatchTileRows<D>(a + r0 * lda, r1 - r0, lda, panel, k0, k1, prefetch, out + r0 * kPanelWidth);
    }
  }
}

}  // namespace

PREFIXD_TARGET_AVX512 void PanelsFewRowsAvx512(const float* a, int64_t lda, int64_t rows,
                                               PanelRef panel, int64_t num_panels, float* out) {
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

PREFIXD_TARGET_AVX512 void PanelRowsAvx512(const float* a, int64_t rows, int64_t lda,
                                           PanelRef panel, bool prefetch, float* out) {
  switch (panel.dtype) {
    case DType::kF32:
      return prefetch ? Rows<DType::kF32, true>(a, rows, lda, panel.data, panel.k, out)
                      : Rows<DType::kF32, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return prefetch ? Rows<DType::kF16, true>(a, rows, lda, panel.data, panel.k, out)
                      : Rows<DType::kF16, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return prefetch ? Rows<DType::kBF16, true>(a, rows, lda, panel.data, panel.k, out)
                      : Rows<DType::kBF16, false>(a, rows, lda, panel.data, panel.k, out);
    case DType::kI8:  // PanelInt8Avx512
      break;
  }
  PREFIXD_CHECK(false);
}

PREFIXD_TARGET_AVX512 void PanelBatchAvx512(const float* a, int64_t rows, int64_t lda,
                                            PanelRef panel, float* out) {
  PREFIXD_CHECK(rows >= 1 && rows <= kMaxBatchRows);
  switch (panel.dtype) {
    case DType::kF32:
      return Batch<DType::kF32>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return Batch<DType::kF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return Batch<DType::kBF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kI8:  // PanelInt8Avx512
      break;
  }
  PREFIXD_CHECK(false);
}

// ---- int8 ----

// The int8 template (matmul_int8.h) compiled for AVX-512 with VNNI. Everything it includes
// was included above without the target, so only its own (internal-linkage) functions get it.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512vnni,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni,fma,f16c")
#endif
}  // namespace prefixd::internal

#include "kernels/cpu/matmul_int8.h"

namespace prefixd::internal {
namespace {

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

void PanelInt8Avx512(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out) {
  PREFIXD_CHECK(panel.dtype == DType::kI8 && rows >= 1 && rows <= kMaxBatchRows);
  Int8Panel<Avx512VnniInt8>(a, row0, rows, panel.data, (panel.k + kInt8BlockK - 1) / kInt8BlockK,
                            out);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

bool CpuHasAvx512Vnni() {
  static const bool has = CpuHasAvx512() && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}

bool CpuHasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return has;
}

}  // namespace prefixd::internal
