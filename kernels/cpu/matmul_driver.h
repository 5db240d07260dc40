// The float register blocks behind MatMul (matmul_kernels.h), written once over an
// instruction set's vector operations: matmul_avx2.cc and matmul_avx512.cc each instantiate
// these templates with their own Isa (AVX-512's under its target pragma). Internal to
// kernels/cpu; see matmul_kernels.h for the invariant every block keeps (one fma chain per
// element, K in order, from +0.0f).
//
// Isa supplies, for vectors V of kLanes fp32 lanes:
//   Load<D>(p)          kLanes panel elements of dtype D as fp32, exactly (aligned)
//   Broadcast(p)        *p in every lane
//   Zero(), Fma(a, b, c), LoadAligned(p), StoreAligned(p, v), Store(p, v) (unaligned)
//   kPrefetchHint       the hint of the prefill blocks' panel prefetches
//   kRowsUnroll         k steps per loop trip of the prefill blocks (1 or 2)
//   RowsVectors(R)      vectors per tile of an R-row prefill block (kLanes x that columns)
//   RowsPrefetch<D>(R, prefetch)
//                       panel rows (of D) the prefill block prefetches ahead, 0 for none
//   BatchTileVectors(R) vectors per tile of an R-row batched block
#ifndef PREFIXD_KERNELS_CPU_MATMUL_DRIVER_H_
#define PREFIXD_KERNELS_CPU_MATMUL_DRIVER_H_

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

namespace prefixd::internal {

// The element a panel of dtype D stores.
template <DType D>
using PanelElem = std::conditional_t<D == DType::kF32, float, uint16_t>;

namespace {  // internal linkage: each instruction set's file compiles its own copy

// One k of the prefill and few-row blocks: acc[r][v] += a[r, kk] * p[kk, kLanes v + c], after
// prefetching the panel row kDistance rows ahead (0: no prefetch), once per cache line of the
// tile's columns.
template <class Isa, DType D, int R, int NV, int64_t kDistance>
__attribute__((always_inline)) inline void MicroStep(const float* a, int64_t lda,
                                                     const PanelElem<D>* p, int64_t kk,
                                                     typename Isa::V (&acc)[R][NV]) {
  using T = PanelElem<D>;
  const T* prow = p + kk * kPanelWidth;
  if constexpr (kDistance > 0) {
    constexpr int64_t kBytes = NV * Isa::kLanes * sizeof(T);
#pragma GCC unroll 16
    for (int64_t line = 0; line < kBytes; line += 64) {
      const char* at = reinterpret_cast<const char*>(prow + kDistance * kPanelWidth) + line;
      // Spelled out: g++ takes the hint as an enum type that clang does not have.
      if constexpr (Isa::kPrefetchHint == _MM_HINT_T0) {
        _mm_prefetch(at, _MM_HINT_T0);
      } else {
        _mm_prefetch(at, _MM_HINT_T1);
      }
    }
  }
  typename Isa::V b[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) b[v] = Isa::template Load<D>(prow + Isa::kLanes * v);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const typename Isa::V av = Isa::Broadcast(a + r * lda + kk);
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Fma(av, b[v], acc[r][v]);
  }
}

// out[r, c] = sum_k a[r, k] * p[k, c], one fma chain per element, K in order, for R rows and
// the NV kLanes columns at `p` (row stride kPanelWidth). Always inlined: compiled on its own,
// g++ 12 kept the accumulators in memory, storing each one every k (half the prefill rate).
template <class Isa, DType D, int R, int NV, int64_t kDistance>
__attribute__((always_inline)) inline void Micro(const float* a, int64_t lda, const PanelElem<D>* p,
                                                 int64_t k, float* out) {
  typename Isa::V acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Zero();
  int64_t kk = 0;
  if constexpr (Isa::kRowsUnroll == 2) {
    // Two k per loop trip: the loop's own instructions were measurable next to 24 FMAs.
    for (; kk + 2 <= k; kk += 2) {
      MicroStep<Isa, D, R, NV, kDistance>(a, lda, p, kk, acc);
      MicroStep<Isa, D, R, NV, kDistance>(a, lda, p, kk + 1, acc);
    }
  }
  for (; kk < k; ++kk) MicroStep<Isa, D, R, NV, kDistance>(a, lda, p, kk, acc);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) Isa::Store(out + r * kPanelWidth + Isa::kLanes * v, acc[r][v]);
}

// R rows of one whole panel, in tiles of Isa::RowsVectors(R) vectors (each tile touches its
// own cache lines of every panel row, so the panel still comes from memory once).
template <class Isa, DType D, int R, bool kPrefetch>
void RowsBlock(const float* a, int64_t lda, const PanelElem<D>* panel, int64_t k, float* out) {
  constexpr int kNV = Isa::RowsVectors(R);
  constexpr int64_t kDistance = Isa::template RowsPrefetch<D>(R, kPrefetch);
  for (int64_t c = 0; c < kPanelWidth; c += Isa::kLanes * kNV) {
    Micro<Isa, D, R, kNV, kDistance>(a, lda, panel + c, k, out + c);
  }
}

// The prefill blocks: out[r, 0..64) = a[r, 0..k) . panel for r in [0, rows),
// 1 <= rows <= Isa::kMaxRows (at most 8).
template <class Isa, DType D, bool kPrefetch>
void Rows(const float* a, int64_t rows, int64_t lda, const void* data, int64_t k, float* out) {
  const PanelElem<D>* panel = static_cast<const PanelElem<D>*>(data);
  static_assert(Isa::kMaxRows >= 6 && Isa::kMaxRows <= 8);
  switch (rows) {
    case 1:
      return RowsBlock<Isa, D, 1, kPrefetch>(a, lda, panel, k, out);
    case 2:
      return RowsBlock<Isa, D, 2, kPrefetch>(a, lda, panel, k, out);
    case 3:
      return RowsBlock<Isa, D, 3, kPrefetch>(a, lda, panel, k, out);
    case 4:
      return RowsBlock<Isa, D, 4, kPrefetch>(a, lda, panel, k, out);
    case 5:
      return RowsBlock<Isa, D, 5, kPrefetch>(a, lda, panel, k, out);
    case 6:
      return RowsBlock<Isa, D, 6, kPrefetch>(a, lda, panel, k, out);
    case 7:
      if constexpr (Isa::kMaxRows >= 7)
        return RowsBlock<Isa, D, 7, kPrefetch>(a, lda, panel, k, out);
      break;
    case 8:
      if constexpr (Isa::kMaxRows >= 8)
        return RowsBlock<Isa, D, 8, kPrefetch>(a, lda, panel, k, out);
      break;
  }
  __builtin_trap();  // rows outside [1, kMaxRows]: MatMul never asks for them
}

// ---- Batched decode ----

// Panel bytes per K chunk: the chunk being multiplied and the one being prefetched both fit
// a 32 KiB L1 next to the rows' inputs.
constexpr int64_t kBatchChunkBytes = 8 << 10;
// Rows per batched block at most (AVX-512: 6 rows x 4 zmm, the whole 64-column panel row, are
// 24 accumulators, 4 panel loads and a broadcast of the 32 registers; AVX2 takes the panel in
// several tiles, Isa::BatchTileVectors).
constexpr int kMaxBatchTileRows = 6;

// out[r, 0..kLanes NV) (row stride kPanelWidth) continues its fma chains over panel rows
// [k0, k1) for R rows and the kLanes NV columns at `p`: from +0.0f when k0 == 0, else from
// the partial sums stored there; one step of `prefetch` per k.
template <class Isa, DType D, int R, int NV>
__attribute__((always_inline)) inline void BatchTile(const float* a, int64_t lda,
                                                     const PanelElem<D>* p, int64_t k0, int64_t k1,
                                                     PrefetchSpread& prefetch, float* out) {
  typename Isa::V acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = k0 == 0 ? Isa::Zero() : Isa::LoadAligned(out + r * kPanelWidth + Isa::kLanes * v);
    }
  }
  // A local copy: through the reference its counters went to memory every k, a store-to-load
  // chain longer than the k step's arithmetic.
  PrefetchSpread spread = prefetch;
  for (int64_t kk = k0; kk < k1; ++kk) {
    const PanelElem<D>* prow = p + kk * kPanelWidth;
    spread.Step();
    typename Isa::V b[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) b[v] = Isa::template Load<D>(prow + Isa::kLanes * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const typename Isa::V av = Isa::Broadcast(a + r * lda + kk);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::Fma(av, b[v], acc[r][v]);
    }
  }
  prefetch = spread;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      Isa::StoreAligned(out + r * kPanelWidth + Isa::kLanes * v, acc[r][v]);
    }
}

// The tiles of an R-row block across the whole panel: kPanelWidth / (kLanes NV) of them,
// NV = Isa::BatchTileVectors(R), and a narrower last one when NV does not divide the panel.
template <class Isa, DType D, int R>
__attribute__((always_inline)) inline void BatchBlock(const float* a, int64_t lda,
                                                      const PanelElem<D>* p, int64_t k0, int64_t k1,
                                                      PrefetchSpread& prefetch, float* out) {
  constexpr int kVectors = kPanelWidth / Isa::kLanes;
  constexpr int kNV = Isa::BatchTileVectors(R);
  constexpr int kFull = kVectors / kNV, kLast = kVectors % kNV;
  constexpr int kCols = Isa::kLanes * kNV;
#pragma GCC unroll 4
  for (int t = 0; t < kFull; ++t) {
    BatchTile<Isa, D, R, kNV>(a, lda, p + kCols * t, k0, k1, prefetch, out + kCols * t);
  }
  if constexpr (kLast > 0) {
    BatchTile<Isa, D, R, kLast>(a, lda, p + kCols * kFull, k0, k1, prefetch, out + kCols * kFull);
  }
}

// Tiles (k passes over a chunk) an R-row block makes across the panel.
template <class Isa>
constexpr int TilesPerBlock(int rows) {
  constexpr int kVectors = kPanelWidth / Isa::kLanes;
  int tiles = 0;
  for (int r = 1; r <= kMaxBatchTileRows; ++r) {
    if (r == rows) tiles = (kVectors + Isa::BatchTileVectors(r) - 1) / Isa::BatchTileVectors(r);
  }
  return tiles;
}

template <class Isa, DType D>
void BatchBlockRows(const float* a, int64_t rows, int64_t lda, const PanelElem<D>* p, int64_t k0,
                    int64_t k1, PrefetchSpread& prefetch, float* out) {
  switch (rows) {
    case 1:
      return BatchBlock<Isa, D, 1>(a, lda, p, k0, k1, prefetch, out);
    case 2:
      return BatchBlock<Isa, D, 2>(a, lda, p, k0, k1, prefetch, out);
    case 3:
      return BatchBlock<Isa, D, 3>(a, lda, p, k0, k1, prefetch, out);
    case 4:
      return BatchBlock<Isa, D, 4>(a, lda, p, k0, k1, prefetch, out);
    case 5:
      return BatchBlock<Isa, D, 5>(a, lda, p, k0, k1, prefetch, out);
    case 6:
      return BatchBlock<Isa, D, 6>(a, lda, p, k0, k1, prefetch, out);
  }
  __builtin_trap();  // Batch below never asks for more than kMaxBatchTileRows
}

// The batched blocks (matmul_kernels.h PanelBatchAvx2): the panel walked once in K chunks,
// each prefetched while the previous one is multiplied by every row block.
template <class Isa, DType D>
void Batch(const float* a, int64_t rows, int64_t lda, const void* data, int64_t k, float* out) {
  using T = PanelElem<D>;
  const T* panel = static_cast<const T*>(data);
  constexpr int64_t kChunk = kBatchChunkBytes / (kPanelWidth * sizeof(T));
  // Row blocks of near-equal size (8 rows: 4 + 4, not 6 + 2).
  const int64_t blocks = (rows + kMaxBatchTileRows - 1) / kMaxBatchTileRows;
  int64_t tiles = 0;  // per k, over all blocks
  for (int64_t b = 0; b < blocks; ++b) {
    tiles += TilesPerBlock<Isa>(static_cast<int>(rows * (b + 1) / blocks - rows * b / blocks));
  }
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t k1 = std::min(k, k0 + kChunk);
    PrefetchSpread prefetch = ChunkPrefetch<PrefetchFarChunk(D)>(panel, kPanelWidth * sizeof(T), k,
                                                                 k1, kChunk, (k1 - k0) * tiles);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = rows * b / blocks, r1 = rows * (b + 1) / blocks;
      BatchBlockRows<Isa, D>(a + r0 * lda, r1 - r0, lda, panel, k0, k1, prefetch,
                             out + r0 * kPanelWidth);
    }
  }
}

}  // namespace
}  // namespace prefixd::internal

#endif  // PREFIXD_KERNELS_CPU_MATMUL_DRIVER_H_
