// The AVX-512 blocks of MatMul. Every function here carries the target attribute instead of
// the file being built with -mavx512f: a header's inline function compiled here with AVX-512
// could otherwise be the copy the linker keeps, and crash a CPU without it.
#include "kernels/cpu/matmul_avx512.h"

#include <immintrin.h>

#include "base/check.h"
#include "kernels/cpu/matmul.h"

#define PREFIXD_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,fma")))

namespace prefixd::internal {
namespace {

// Panel rows this far ahead are prefetched: a decode step streams each panel from memory
// once, and the hardware prefetcher alone leaves the single-row kernel waiting on DRAM. (A
// prefetch past the end of the panel, or of the allocation, is harmless: it never faults.)
// Into L2 (T1): measured a little better than T0 for decode and no worse for prefill.
constexpr int64_t kPrefetchRows = 64;  // 16 KiB ahead
// The few-row (decode) kernel walks two panels at once, each prefetched this many rows
// ahead: a short distance, since the two streams' prefetches together already fill the
// core's queue of outstanding misses (longer distances measured slower).
constexpr int64_t kFewRowsPrefetchRows = 4;  // 1 KiB ahead

// One k of Micro and FewRows below: acc[r][v] += a[r, kk] * p[kk, 16 v + c], after
// prefetching the panel row kDistance rows ahead (0: no prefetch).
template <int R, int NV, int64_t kDistance>
PREFIXD_TARGET_AVX512 __attribute__((always_inline)) inline void MicroStep(
    const float* a, int64_t lda, const float* p, int64_t kk, __m512 (&acc)[R][NV]) {
  const float* prow = p + kk * kPanelWidth;
  if constexpr (kDistance > 0) {
    for (int v = 0; v < NV; ++v) {
      _mm_prefetch(reinterpret_cast<const char*>(prow + kDistance * kPanelWidth + 16 * v),
                   _MM_HINT_T1);
    }
  }
  __m512 b[NV];
  for (int v = 0; v < NV; ++v) b[v] = _mm512_load_ps(prow + 16 * v);
  for (int r = 0; r < R; ++r) {
    const __m512 av = _mm512_set1_ps(a[r * lda + kk]);
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, b[v], acc[r][v]);
  }
}

// acc[r][v] = sum_k a[r, k] * p[k, 16 v + c], one fma chain per element, K in order, for R
// rows and NV*16 columns starting at `p` (row stride kPanelWidth). Two k per loop trip (the
// loop's own instructions were measurable next to 24 FMAs). kPrefetch: the panel is not yet
// in cache (the first row block of a task); later blocks find it in L2, where the prefetches
// only cost issue slots (measured ≈5 % of the kernel's rate).
template <int R, int NV, bool kPrefetch>
PREFIXD_TARGET_AVX512 inline void Micro(const float* a, int64_t lda, const float* p, int64_t k,
                                        float* out) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  constexpr int64_t kDistance = kPrefetch ? kPrefetchRows : 0;
  int64_t kk = 0;
  for (; kk + 2 <= k; kk += 2) {
    MicroStep<R, NV, kDistance>(a, lda, p, kk, acc);
    MicroStep<R, NV, kDistance>(a, lda, p, kk + 1, acc);
  }
  if (kk < k) MicroStep<R, NV, kDistance>(a, lda, p, kk, acc);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm512_store_ps(out + r * kPanelWidth + 16 * v, acc[r][v]);
}

// R rows of one whole panel. Up to 6 rows hold the full 64 columns in 4R of the 32 zmm
// registers; 7 and 8 rows take the panel in two 32-column halves (each half touches its own
// cache lines of every panel row, so the panel still comes from memory once).
template <int R, bool kPrefetch>
PREFIXD_TARGET_AVX512 void Block(const float* a, int64_t lda, const float* panel, int64_t k,
                                 float* out) {
  if constexpr (R <= 6) {
    Micro<R, 4, kPrefetch>(a, lda, panel, k, out);
  } else {
    Micro<R, 2, kPrefetch>(a, lda, panel, k, out);
    Micro<R, 2, kPrefetch>(a, lda, panel + 32, k, out + 32);
  }
}

template <bool kPrefetch>
PREFIXD_TARGET_AVX512 void Rows(const float* a, int64_t rows, int64_t lda, const float* panel,
                                int64_t k, float* out) {
  switch (rows) {
    case 1:
      return Block<1, kPrefetch>(a, lda, panel, k, out);
    case 2:
      return Block<2, kPrefetch>(a, lda, panel, k, out);
    case 3:
      return Block<3, kPrefetch>(a, lda, panel, k, out);
    case 4:
      return Block<4, kPrefetch>(a, lda, panel, k, out);
    case 5:
      return Block<5, kPrefetch>(a, lda, panel, k, out);
    case 6:
      return Block<6, kPrefetch>(a, lda, panel, k, out);
    case 7:
      return Block<7, kPrefetch>(a, lda, panel, k, out);
    case 8:
      return Block<8, kPrefetch>(a, lda, panel, k, out);
  }
  PREFIXD_CHECK(false);
}

// R rows against S consecutive panels, each panel its own stream (see PanelsFewRowsAvx512);
// R x S x 4 accumulators.
template <int R, int S>
PREFIXD_TARGET_AVX512 void FewRows(const float* a, int64_t lda, const float* panel, int64_t k,
                                   float* out) {
  const int64_t panel_stride = k * kPanelWidth;
  __m512 acc[S][R][4];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) acc[s][r][v] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int s = 0; s < S; ++s) {
      MicroStep<R, 4, kFewRowsPrefetchRows>(a, lda, panel + s * panel_stride, kk, acc[s]);
    }
  }
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) {
        _mm512_store_ps(out + (s * R + r) * kPanelWidth + 16 * v, acc[s][r][v]);
      }
}

}  // namespace

PREFIXD_TARGET_AVX512 void PanelsFewRowsAvx512(const float* a, int64_t lda, int64_t rows,
                                               const float* panel, int64_t num_panels, int64_t k,
                                               float* out) {
  PREFIXD_CHECK(num_panels == 1 || num_panels == 2);
  switch (rows * 2 + num_panels - 1) {
    case 2:
      return FewRows<1, 1>(a, lda, panel, k, out);
    case 3:
      return FewRows<1, 2>(a, lda, panel, k, out);
    case 4:
      return FewRows<2, 1>(a, lda, panel, k, out);
    case 5:
      return FewRows<2, 2>(a, lda, panel, k, out);
    case 6:
      return FewRows<3, 1>(a, lda, panel, k, out);
    case 7:
      return FewRows<3, 2>(a, lda, panel, k, out);
  }
  PREFIXD_CHECK(false);
}

PREFIXD_TARGET_AVX512 void PanelRowsAvx512(const float* a, int64_t rows, int64_t lda,
                                           const float* panel, int64_t k, bool prefetch,
                                           float* out) {
  if (prefetch) return Rows<true>(a, rows, lda, panel, k, out);
  return Rows<false>(a, rows, lda, panel, k, out);
}

bool CpuHasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return has;
}

}  // namespace prefixd::internal
