// The int8 register blocks behind MatMul (matmul.h, "int8 panels"), one template over an
// instruction set's integer dot product. Internal to kernels/cpu: matmul_avx2.cc,
// matmul_avxvnni.cc and matmul_avx512.cc include it (the latter two under their own target
// pragma) and instantiate it with their Ops. The panel layout is in matmul_kernels.h.
//
// Invariant: for every row r and column c, and each K block b of kInt8BlockK rows in order,
//   isum = sum over the block of qa[r, k] * qw[k, c]        (exact in int32)
//   acc  = fma(float(isum), sa[r, b] * sw[b, c], acc)       (from acc = +0.0f)
// which is MatMulReferenceInt8. The integer sum is exact whatever the instructions (|isum| <=
// 32 * 127 * 127 < 2^24, so float(isum) is exact too), and every fp32 operation is the same
// one in the same order on every path, so all instruction sets, row counts and threads give
// the same bits. Partial sums wait between K chunks in `out` (an fp32 store and reload: exact).
//
// Ops supplies, for vectors of kLanes int32 / fp32 lanes (kLanes columns):
//   I, F, W, A                   integer, float, prepared-weight and -activation vectors
//   Weights(p)                   4 k x kLanes columns of the panel at p (bytes qw + 128)
//   Acts(p)                      qa[k..k+4) of a row, broadcast
//   Init(sum)                    the integer accumulator's start for a row whose block sums
//                                to `sum` (what Dot's encoding of the weights needs)
//   Dot(acc, w, a)               acc + the 4-term products, exactly
//   ToFloat, FLoad, FStore, FZero, FSet1, Mul, Fma
//   Tile(R) -> vectors per tile  (NV: kLanes x NV columns), kMaxTileRows
#ifndef PREFIXD_KERNELS_CPU_MATMUL_INT8_H_
#define PREFIXD_KERNELS_CPU_MATMUL_INT8_H_

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"

namespace prefixd::internal {

namespace {  // internal linkage: each instruction set's file compiles its own copy

// K blocks per chunk: a full panel's chunk (9 KiB) and the one being prefetched both stay in
// L1 while every row tile passes over it.
constexpr int64_t kInt8ChunkBlocks = 4;

// out[r, c0 .. c0 + kLanes NV) continues its sums over K blocks [b0, b1) for R rows starting
// at row0 of `a`: from +0.0f when b0 == 0, else from the partial sums in `out` (row stride
// kPanelWidth). One step of `prefetch` per quad row.
template <class Ops, int R, int NV>
__attribute__((always_inline)) inline void Int8Tile(const Int8Rows& a, int64_t row0,
                                                    const uint8_t* panel, int64_t c0, int64_t b0,
                                                    int64_t b1, PrefetchSpread& prefetch,
                                                    float* out) {
  using I = typename Ops::I;
  using F = typename Ops::F;
  constexpr int kL = Ops::kLanes;
  F facc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      facc[r][v] = b0 == 0 ? Ops::FZero() : Ops::FLoad(out + r * kPanelWidth + c0 + kL * v);
    }
  }
  PrefetchSpread spread = prefetch;  // a local copy, as in the float blocks (matmul_avx2.cc)
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* block = panel + b * kInt8BlockBytes + c0 * 4;
    I iacc[R][NV];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const I init = Ops::Init(a.sum[(row0 + r) * a.blocks + b]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) iacc[r][v] = init;
    }
    const int8_t* qa = a.q + row0 * a.q_stride + b * kInt8BlockK;
#pragma GCC unroll 8
    for (int64_t quad = 0; quad < kInt8QuadRows; ++quad) {
      spread.Step();
      typename Ops::W w[NV];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) {
        w[v] = Ops::Weights(block + quad * kInt8QuadRowBytes + v * kL * 4);
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const typename Ops::A av = Ops::Acts(qa + r * a.q_stride + 4 * quad);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) iacc[r][v] = Ops::Dot(iacc[r][v], w[v], av);
      }
    }
    const float* sw =
        reinterpret_cast<const float*>(panel + b * kInt8BlockBytes + kInt8BlockWeightBytes) + c0;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const F sa = Ops::FSet1(a.scale[(row0 + r) * a.blocks + b]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) {
        facc[r][v] =
            Ops::Fma(Ops::ToFloat(iacc[r][v]), Ops::Mul(sa, Ops::FLoad(sw + kL * v)), facc[r][v]);
      }
    }
  }
  prefetch = spread;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) Ops::FStore(out + r * kPanelWidth + c0 + kL * v, facc[r][v]);
}

// The column tiles of an R-row tile across the panel.
template <class Ops, int R>
__attribute__((always_inline)) inline void Int8RowTile(const Int8Rows& a, int64_t row0,
                                                       const uint8_t* panel, int64_t b0, int64_t b1,
                                                       PrefetchSpread& prefetch, float* out) {
  constexpr int kNV = Ops::Tile(R);
  constexpr int kCols = Ops::kLanes * kNV;
  static_assert(kPanelWidth % kCols == 0);
#pragma GCC unroll 8
  for (int64_t c0 = 0; c0 < kPanelWidth; c0 += kCols) {
    Int8Tile<Ops, R, kNV>(a, row0, panel, c0, b0, b1, prefetch, out);
  }
}

template <class Ops>
void Int8TileRows(const Int8Rows& a, int64_t row0, int64_t rows, const uint8_t* panel, int64_t b0,
                  int64_t b1, PrefetchSpread& prefetch, float* out) {
  static_assert(Ops::kMaxTileRows <= 6);
  switch (rows) {
    case 1:
      return Int8RowTile<Ops, 1>(a, row0, panel, b0, b1, prefetch, out);
    case 2:
      if constexpr (Ops::kMaxTileRows >= 2)
        return Int8RowTile<Ops, 2>(a, row0, panel, b0, b1, prefetch, out);
      break;
    case 3:
      if constexpr (Ops::kMaxTileRows >= 3)
        return Int8RowTile<Ops, 3>(a, row0, panel, b0, b1, prefetch, out);
      break;
    case 4:
      if constexpr (Ops::kMaxTileRows >= 4)
        return Int8RowTile<Ops, 4>(a, row0, panel, b0, b1, prefetch, out);
      break;
    case 5:
      if constexpr (Ops::kMaxTileRows >= 5)
        return Int8RowTile<Ops, 5>(a, row0, panel, b0, b1, prefetch, out);
      break;
    case 6:
      if constexpr (Ops::kMaxTileRows >= 6)
        return Int8RowTile<Ops, 6>(a, row0, panel, b0, b1, prefetch, out);
      break;
  }
  __builtin_trap();  // rows outside [1, kMaxTileRows]: a bug in Int8Panel below
}

// Tiles (quad-row passes over a chunk) one R-row tile makes across the panel.
template <class Ops>
constexpr int64_t Int8TilesPerRowTile(int64_t rows) {
  int64_t n = 0;
  for (int r = 1; r <= Ops::kMaxTileRows; ++r) {
    if (r == rows) n = kPanelWidth / (Ops::kLanes * Ops::Tile(r));
  }
  return n;
}

// out[r, 0..64) = the int8 product of rows [row0, row0 + rows) of `a` with one panel (`blocks`
// K blocks at `panel`); `out` is [rows, 64], 64-byte aligned. The panel is walked once in chunks
// that fit L1, each prefetched (and, for the single-stream decode, the one after it into L2)
// while the previous one is multiplied by every row tile.
template <class Ops>
void Int8Panel(const Int8Rows& a, int64_t row0, int64_t rows, const void* panel_data,
               int64_t blocks, float* out) {
  const uint8_t* panel = static_cast<const uint8_t*>(panel_data);
  // Row tiles of near-equal size (8 rows in 6-row tiles: 4 + 4, not 6 + 2).
  const int64_t tiles = (rows + Ops::kMaxTileRows - 1) / Ops::kMaxTileRows;
  int64_t passes = 0;  // quad-row passes per quad row of a chunk, over all tiles
  for (int64_t t = 0; t < tiles; ++t) {
    passes += Int8TilesPerRowTile<Ops>(rows * (t + 1) / tiles - rows * t / tiles);
  }
  for (int64_t b0 = 0; b0 < blocks; b0 += kInt8ChunkBlocks) {
    const int64_t b1 = std::min(blocks, b0 + kInt8ChunkBlocks);
    PrefetchSpread prefetch = ChunkPrefetch<true>(
        panel, kInt8BlockBytes, blocks, b1, kInt8ChunkBlocks, (b1 - b0) * kInt8QuadRows * passes);
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t r0 = rows * t / tiles, r1 = rows * (t + 1) / tiles;
      Int8TileRows<Ops>(a, row0 + r0, r1 - r0, panel, b0, b1, prefetch, out + r0 * kPanelWidth);
    }
  }
}

}  // namespace
}  // namespace prefixd::internal

#endif  // PREFIXD_KERNELS_CPU_MATMUL_INT8_H_
