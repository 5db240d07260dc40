// The AVX2 + FMA + F16C register blocks of MatMul (see matmul_kernels.h). This library is
// built for x86-64-v3, so these need no target attributes.
#include <immintrin.h>

#include <algorithm>

#include "base/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

// Register-block loops over rows and vectors are unrolled completely (#pragma GCC unroll), so
// that g++ keeps each accumulator in a register: left to itself it kept some blocks'
// accumulators in memory and stored them every k (half the kernel's rate).

namespace prefixd::internal {
namespace {

// Panel rows the single-row block prefetches ahead, counted in f32 rows (a half-precision
// panel goes twice as many rows ahead: the same bytes).
constexpr int64_t kDecodePrefetchRows = 16;

// Eight panel elements as fp32, exactly (fp16 and bf16 widen without rounding). `p` is
// 16-byte aligned for the half types, 32-byte for f32.
template <DType D>
struct Load8;
template <>
struct Load8<DType::kF32> {
  using T = float;
  static __m256 At(const float* p) { return _mm256_load_ps(p); }
};
template <>
struct Load8<DType::kF16> {
  using T = uint16_t;
  static __m256 At(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
template <>
struct Load8<DType::kBF16> {
  using T = uint16_t;
  static __m256 At(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

// acc[r][c] = sum_k a[r, k] * p[k, c] as one fma chain per element, K in order, for R rows
// and NV*8 columns starting at `p` (a panel plus a column offset; row stride kPanelWidth).
// Always inlined: compiled on its own, g++ 12 kept the accumulators in memory, storing each
// one every k (half the prefill rate).
// kPrefetchDistance > 0: prefetch the panel that many rows ahead (the single-row decode
// block, which streams the panel from memory; 0 for blocks that find it in cache).
template <DType D, int R, int NV, int64_t kPrefetchDistance = 0>
__attribute__((always_inline)) inline void MicroKernel(const float* a, int64_t lda,
                                                       const typename Load8<D>::T* p, int64_t k,
                                                       float* out) {
  __m256 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    const auto* prow = p + kk * kPanelWidth;
    if constexpr (kPrefetchDistance > 0) {
      constexpr int64_t kBytes = NV * 8 * sizeof(*prow);
#pragma GCC unroll 16
      for (int64_t line = 0; line < kBytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(prow + kPrefetchDistance * kPanelWidth) + line,
                     _MM_HINT_T0);
      }
    }
    __m256 b[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) b[v] = Load8<D>::At(prow + 8 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, b[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + r * kPanelWidth + 8 * v, acc[r][v]);
}

// Full 64-column panel for R rows: out is [R, kPanelWidth].
template <DType D, int R>
void PanelBlock(const float* a, int64_t lda, const typename Load8<D>::T* panel, int64_t k,
                float* out) {
  // Register budget (16 ymm): R x NV accumulators + NV panel loads + 1 broadcast.
  constexpr int NV = R == 1 ? 8 : R == 2 ? 4 : 2;
  // One row is a decode step's stream of the weights from memory: prefetch ahead.
  constexpr int64_t kDistance = R == 1 ? kDecodePrefetchRows * sizeof(float) / sizeof(*panel) : 0;
  for (int64_t c = 0; c < kPanelWidth; c += 8 * NV) {
    MicroKernel<D, R, NV, kDistance>(a, lda, panel + c, k, out + c);
  }
}

template <DType D>
void Rows(const float* a, int64_t rows, int64_t lda, const void* data, int64_t k, float* out) {
  const auto* panel = static_cast<const typename Load8<D>::T*>(data);
  switch (rows) {
    case 1:
      return PanelBlock<D, 1>(a, lda, panel, k, out);
    case 2:
      return PanelBlock<D, 2>(a, lda, panel, k, out);
    case 3:
      return PanelBlock<D, 3>(a, lda, panel, k, out);
    case 4:
      return PanelBlock<D, 4>(a, lda, panel, k, out);
    case 5:
      return PanelBlock<D, 5>(a, lda, panel, k, out);
    case 6:
      return PanelBlock<D, 6>(a, lda, panel, k, out);
  }
  PREFIXD_CHECK(false);
}

// ---- Batched decode ----

// Panel bytes per K chunk: the chunk being multiplied and the one being prefetched both fit
// a 32 KiB L1 next to the rows' inputs.
constexpr int64_t kBatchChunkBytes = 8 << 10;
// Columns per tile: 2 ymm of 8. With up to 6 rows that is 12 accumulators, 2 panel loads and
// a broadcast of the 16 registers.
constexpr int64_t kBatchTileColumns = 16;
constexpr int kMaxBatchTileRows = 6;

// out[r, 0..16) (row stride kPanelWidth) continues its fma chains over panel rows
// [k0, k1) for R rows and the 16 columns at `p`: from +0.0f when k0 == 0, else from the
// partial sums stored there; one step of `prefetch` per k.
template <DType D, int R>
__attribute__((always_inline)) inline void BatchTile(const float* a, int64_t lda,
                                                     const typename Load8<D>::T* p, int64_t k0,
                                                     int64_t k1, PrefetchSpread& prefetch,
                                                     float* out) {
  __m256 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < 2; ++v) {
      acc[r][v] = k0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(out + r * kPanelWidth + 8 * v);
    }
  }
  // A local copy: through the reference its counters went to memory every k, a store-to-load
  // chain longer than the k step's arithmetic.
  PrefetchSpread spread = prefetch;
  for (int64_t kk = k0; kk < k1; ++kk) {
    const auto* prow = p + kk * kPanelWidth;
    spread.Step();
    const __m256 b0 = Load8<D>::At(prow);
    const __m256 b1 = Load8<D>::At(prow + 8);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  prefetch = spread;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < 2; ++v) _mm256_store_ps(out + r * kPanelWidth + 8 * v, acc[r][v]);
}

template <DType D>
void BatchTileRows(const float* a, int64_t rows, int64_t lda, const typename Load8<D>::T* p,
                   int64_t k0, int64_t k1, PrefetchSpread& prefetch, float* out) {
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
void Batch(const float* a, int64_t rows, int64_t lda, const void* data, int64_t k, float* out) {
  using T = typename Load8<D>::T;
  const T* panel = static_cast<const T*>(data);
  constexpr int64_t kChunk = kBatchChunkBytes / (kPanelWidth * sizeof(T));
  constexpr int64_t kColumnGroups = kPanelWidth / kBatchTileColumns;
  // Row blocks of near-equal size (8 rows: 4 + 4, not 6 + 2).
  const int64_t blocks = (rows + kMaxBatchTileRows - 1) / kMaxBatchTileRows;
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t k1 = std::min(k, k0 + kChunk);
    const int64_t next_rows = std::min(k, k1 + kChunk) - k1;
    PrefetchSpread prefetch(panel + k1 * kPanelWidth, next_rows * kPanelWidth * sizeof(T),
                            (k1 - k0) * blocks * kColumnGroups);
    for (int64_t c = 0; c < kPanelWidth; c += kBatchTileColumns) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t r0 = rows * b / blocks, r1 = rows * (b + 1) / blocks;
        BatchTileRows<D>(a + r0 * lda, r1 - r0, lda, panel + c, k0, k1, prefetch,
                         out + r0 * kPanelWidth + c);
      }
    }
  }
}

}  // namespace

void PanelRowsAvx2(const float* a, int64_t rows, int64_t lda, PanelRef panel, float* out) {
  switch (panel.dtype) {
    case DType::kF32:
      return Rows<DType::kF32>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return Rows<DType::kF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return Rows<DType::kBF16>(a, rows, lda, panel.data, panel.k, out);
  }
}

void WidenPanelAvx2(PanelRef panel, float* out) {
  PREFIXD_CHECK(panel.dtype != DType::kF32);
  const auto* p = static_cast<const uint16_t*>(panel.data);
  const int64_t n = panel.k * kPanelWidth;
  if (panel.dtype == DType::kF16) {
    for (int64_t i = 0; i < n; i += 8) _mm256_store_ps(out + i, Load8<DType::kF16>::At(p + i));
  } else {
    for (int64_t i = 0; i < n; i += 8) _mm256_store_ps(out + i, Load8<DType::kBF16>::At(p + i));
  }
}

void PanelBatchAvx2(const float* a, int64_t rows, int64_t lda, PanelRef panel, float* out) {
  PREFIXD_CHECK(rows >= 1 && rows <= kMaxBatchRows);
  switch (panel.dtype) {
    case DType::kF32:
      return Batch<DType::kF32>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return Batch<DType::kF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return Batch<DType::kBF16>(a, rows, lda, panel.data, panel.k, out);
  }
}

}  // namespace prefixd::internal
