// The AVX2 + FMA + F16C register blocks of MatMul (see matmul_kernels.h). This library is
// built for x86-64-v3, so these need no target attributes.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_int8.h"
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
constexpr int kMaxBatchTileRows = 6;

// Vectors of 8 columns per tile for a row block of R rows: as many accumulators as the 16 ymm
// registers hold next to the tile's panel loads and a broadcast (R x NV + NV + 1 <= 16), and
// at least 8 of them where R allows, so that the FMAs' latency (4 cycles, 2 ports) is hidden:
// 2 rows x 4 vectors, 3 x 3, 4 x 3 (12), 5 x 2, 6 x 2 (12). With NV = 3 the panel's 8
// vectors go as 3 + 3 + 2.
constexpr int TileVectors(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 3 : 2; }

// out[r, 0..8 NV) (row stride kPanelWidth) continues its fma chains over panel rows [k0, k1)
// for R rows and the 8 NV columns at `p`: from +0.0f when k0 == 0, else from the partial sums
// stored there; one step of `prefetch` per k.
template <DType D, int R, int NV>
__attribute__((always_inline)) inline void BatchTile(const float* a, int64_t lda,
                                                     const typename Load8<D>::T* p, int64_t k0,
                                                     int64_t k1, PrefetchSpread& prefetch,
                                                     float* out) {
  __m256 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = k0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(out + r * kPanelWidth + 8 * v);
    }
  }
  // A local copy: through the reference its counters went to memory every k, a store-to-load
  // chain longer than the k step's arithmetic.
  PrefetchSpread spread = prefetch;
  for (int64_t kk = k0; kk < k1; ++kk) {
    const auto* prow = p + kk * kPanelWidth;
    spread.Step();
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
  prefetch = spread;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm256_store_ps(out + r * kPanelWidth + 8 * v, acc[r][v]);
}

// The tiles of an R-row block across the whole panel: 8 / NV of them, NV = TileVectors(R),
// a narrower last one when NV does not divide 8.
template <DType D, int R>
__attribute__((always_inline)) inline void BatchBlock(const float* a, int64_t lda,
                                                      const typename Load8<D>::T* p, int64_t k0,
                                                      int64_t k1, PrefetchSpread& prefetch,
                                                      float* out) {
  constexpr int kNV = TileVectors(R);
  constexpr int kFull = 8 / kNV, kLast = 8 % kNV;
#pragma GCC unroll 4
  for (int t = 0; t < kFull; ++t) {
    BatchTile<D, R, kNV>(a, lda, p + 8 * kNV * t, k0, k1, prefetch, out + 8 * kNV * t);
  }
  if constexpr (kLast > 0) {
    BatchTile<D, R, kLast>(a, lda, p + 8 * kNV * kFull, k0, k1, prefetch, out + 8 * kNV * kFull);
  }
}

// Tiles (k passes over a chunk) an R-row block makes across the panel.
constexpr int TilesPerBlock(int rows) {
  return (8 + TileVectors(rows) - 1) / TileVectors(rows);
}

template <DType D>
void BatchBlockRows(const float* a, int64_t rows, int64_t lda, const typename Load8<D>::T* p,
                    int64_t k0, int64_t k1, PrefetchSpread& prefetch, float* out) {
  switch (rows) {
    case 1:
      return BatchBlock<D, 1>(a, lda, p, k0, k1, prefetch, out);
    case 2:
      return BatchBlock<D, 2>(a, lda, p, k0, k1, prefetch, out);
    case 3:
      return BatchBlock<D, 3>(a, lda, p, k0, k1, prefetch, out);
    case 4:
      return BatchBlock<D, 4>(a, lda, p, k0, k1, prefetch, out);
    case 5:
      return BatchBlock<D, 5>(a, lda, p, k0, k1, prefetch, out);
    case 6:
      return BatchBlock<D, 6>(a, lda, p, k0, k1, prefetch, out);
  }
  PREFIXD_CHECK(false);
}

template <DType D>
void Batch(const float* a, int64_t rows, int64_t lda, const void* data, int64_t k, float* out) {
  using T = typename Load8<D>::T;
  const T* panel = static_cast<const T*>(data);
  constexpr int64_t kChunk = kBatchChunkBytes / (kPanelWidth * sizeof(T));
  // Row blocks of near-equal size (8 rows: 4 + 4, not 6 + 2).
  const int64_t blocks = (rows + kMaxBatchTileRows - 1) / kMaxBatchTileRows;
  int64_t tiles = 0;  // per k, over all blocks
  for (int64_t b = 0; b < blocks; ++b) {
    tiles += TilesPerBlock(static_cast<int>(rows * (b + 1) / blocks - rows * b / blocks));
  }
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t k1 = std::min(k, k0 + kChunk);
    PrefetchSpread prefetch = ChunkPrefetch<PrefetchFarChunk(D)>(panel, kPanelWidth * sizeof(T), k,
                                                                 k1, kChunk, (k1 - k0) * tiles);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = rows * b / blocks, r1 = rows * (b + 1) / blocks;
      BatchBlockRows<D>(a + r0 * lda, r1 - r0, lda, panel, k0, k1, prefetch,
                        out + r0 * kPanelWidth);
    }
  }
}

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
      return Rows<DType::kF32>(a, rows, lda, panel.data, panel.k, out);
    case DType::kF16:
      return Rows<DType::kF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kBF16:
      return Rows<DType::kBF16>(a, rows, lda, panel.data, panel.k, out);
    case DType::kI8:  // PanelInt8Avx2
      break;
  }
  PREFIXD_CHECK(false);
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
    case DType::kI8:  // PanelInt8Avx2
      break;
  }
  PREFIXD_CHECK(false);
}

}  // namespace prefixd::internal
