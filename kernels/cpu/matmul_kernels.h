// The register blocks behind MatMul (matmul.cc), one set per instruction set: AVX2 + FMA +
// F16C (matmul_avx2.cc, the baseline this library is built for) and AVX-512
// (matmul_avx512.cc, chosen at run time on CPUs that have avx512f and avx512vl); for int8
// panels also AVX-VNNI (matmul_avxvnni.cc) and AMX tiles (matmul_amx.cc). Internal to
// kernels/cpu.
//
// Invariant: every block computes out[r, c] = fma chain over k = 0..K-1 in order, starting
// from +0.0f, with the panel's weight converted exactly to fp32 in a register (f16 and bf16
// widen without rounding). Blocks differ only in how many rows and columns share a pass and in
// where a partial sum waits between K chunks (a register or an fp32 store and reload, both
// exact), which no element can see: every path gives the bits of MatMulReference.
#ifndef PREFIXD_KERNELS_CPU_MATMUL_KERNELS_H_
#define PREFIXD_KERNELS_CPU_MATMUL_KERNELS_H_

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>

#include "engine/dtype.h"
#include "kernels/cpu/matmul.h"

namespace prefixd::internal {

// One packed K x kPanelWidth panel (64-byte aligned), its elements of `dtype`; the next panel
// of the same matrix starts K * kPanelWidth elements later.
struct PanelRef {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t k = 0;
};

// ---- AVX2 ----

// Most rows PanelRowsAvx2 takes in one call.
inline constexpr int64_t kMaxRowsAvx2 = 6;

// out[r, 0..64) = a[r, 0..k) · panel for r in [0, rows), 1 <= rows <= kMaxRowsAvx2: the
// prefill block (and AVX2's single-row decode). `out` is [rows, 64].
void PanelRowsAvx2(const float* a, int64_t rows, int64_t lda, PanelRef panel, float* out);

// ---- AVX-512 ----

// Most rows PanelRowsAvx512 takes in one call.
inline constexpr int64_t kMaxRowsAvx512 = 8;

// As PanelRowsAvx2, 1 <= rows <= kMaxRowsAvx512. `prefetch`: the panel is probably not in
// cache yet (prefetch ahead of the loads), as for a task's first row block; false when an
// earlier block just read it. `out` is 64-byte aligned. Only call when CpuHasAvx512().
void PanelRowsAvx512(const float* a, int64_t rows, int64_t lda, PanelRef panel, bool prefetch,
                     float* out);

// Most rows PanelsFewRowsAvx512 takes.
inline constexpr int64_t kMaxFewRowsAvx512 = 3;

// out[(j * rows + r) * 64 + c] = a[r, 0..k) · panel j, column c, for the `num_panels` (1 or 2)
// consecutive panels starting at `panel` and 1 <= rows <= kMaxFewRowsAvx512: decode batches,
// where the product is a stream of the weights from memory. Two panels walked side by side are
// two independent streams, which keeps more cache misses in flight than one. `out` is 64-byte
// aligned.
void PanelsFewRowsAvx512(const float* a, int64_t lda, int64_t rows, PanelRef panel,
                         int64_t num_panels, float* out);

bool CpuHasAvx512();

// ---- Batched decode, both instruction sets ----

// Row counts the batched blocks serve: a decode step of several sequences, where the
// weights still stream from memory once per step but the rows' arithmetic is as long as the
// stream. (AVX2, which has no few-row kernel, uses them from 2 rows.)
inline constexpr int64_t kMinBatchRows = 4;
inline constexpr int64_t kMaxBatchRows = 64;

// out[r, 0..64) = a[r, 0..k) · panel for r in [0, rows), 1 <= rows <= kMaxBatchRows; `out` is
// [rows, 64], 64-byte aligned, and holds partial sums between K chunks. The panel is walked once in
// chunks of rows that fit L1: each chunk is prefetched while the previous one is multiplied by
// every row block, so the arithmetic of all rows overlaps the stream instead of following it.
void PanelBatchAvx2(const float* a, int64_t rows, int64_t lda, PanelRef panel, float* out);
void PanelBatchAvx512(const float* a, int64_t rows, int64_t lda, PanelRef panel, float* out);

// ---- int8 panels, every instruction set ----

// One panel's K block: kInt8QuadRows rows of [kPanelWidth columns][4 k] bytes qw + 128 (so
// that one 32-bit lane holds a column's 4 consecutive k, what the dot products multiply; the
// offset makes them the unsigned operand vpdpbusd takes), then the block's kPanelWidth fp32
// scales. A panel is ceil(K / kInt8BlockK) such blocks; K past the end holds qw = 0.
inline constexpr int64_t kInt8QuadRows = kInt8BlockK / 4;
inline constexpr int64_t kInt8QuadRowBytes = kPanelWidth * 4;
inline constexpr int64_t kInt8BlockWeightBytes = kInt8QuadRows * kInt8QuadRowBytes;
inline constexpr int64_t kInt8BlockBytes = kInt8BlockWeightBytes + kPanelWidth * 4;

// Activation rows quantized by QuantizeRowInt8 (matmul.cc): row r's block b is
// q[r * q_stride + b * kInt8BlockK ..] (zero past K), scale[r * blocks + b], sum[r * blocks + b].
struct Int8Rows {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const int32_t* sum = nullptr;
  int64_t q_stride = 0;
  int64_t blocks = 0;
};

// out[r, 0..64) = the int8 product of rows [row0, row0 + rows) of `a` with one int8 panel
// (panel.dtype == kI8), 1 <= rows <= kMaxBatchRows; `out` is [rows, 64], 64-byte aligned. The
// AVX-512 one needs CpuHasAvx512Vnni() (integer dot products of 4 bytes, vpdpbusd); the AVX2
// one multiplies bytes with vpmaddubsw. Both give MatMulReferenceInt8's bits.
void PanelInt8Avx2(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out);
void PanelInt8Avx512(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out);
bool CpuHasAvx512Vnni();
// As PanelInt8Avx512 with 256-bit vpdpbusd (AVX-VNNI: Intel since Alder Lake, AMD Zen 5).
// Only call when CpuHasAvxVnni().
void PanelInt8AvxVnni(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out);
bool CpuHasAvxVnni();
// As PanelInt8Avx512 with AMX tiles for each 16 rows (matmul_amx.cc): tdpbsud sums a K block
// of 16 rows x 16 columns; fewer rows left over take PanelInt8Avx512. Only call when
// CpuHasAmx() or AmxEmulated().
void PanelInt8Amx(const Int8Rows& a, int64_t row0, int64_t rows, PanelRef panel, float* out);
// AMX-TILE and AMX-INT8 in CPUID, AVX-512 VNNI, and the kernel granted the tile state.
bool CpuHasAmx();
// Whether PanelInt8Amx runs its tile instructions in scalar code (SetAmxEmulationForTesting).
bool AmxEmulated();
void SetAmxEmulation(bool on);

// Spreads the prefetches of the next K chunk (`near`, into L1) and of the chunk after it
// (`far`, into L2 only) evenly over `steps` k steps (every pass of every row block over this
// chunk): one burst would fill the core's queue of outstanding misses and stall the arithmetic
// behind it, then leave the memory idle for the rest of the chunk. The far stream exists
// because L1 tracks few misses at once: with only the next chunk requested, and only into L1,
// the stream stalls on those few; asked a chunk earlier into L2, whose miss queue is longer,
// the chunk is already there when its L1 prefetches come (which panels: PrefetchFarChunk;
// figures: bench/cpu_backend_bench in docs/BENCHMARKS.md). Each stream is Bresenham's line:
// `lines` prefetches per `steps`.
class PrefetchSpread {
 public:
  struct Range {
    const void* begin;
    int64_t bytes;
  };
  PrefetchSpread(Range near, Range far, int64_t steps) : near_(near), far_(far), steps_(steps) {}
  void Step() {
    near_.Step<_MM_HINT_T0>(steps_);
    far_.Step<_MM_HINT_T1>(steps_);
  }

 private:
  struct Stream {
    explicit Stream(Range r)
        : next(static_cast<const char*>(r.begin)),
          end(next + r.bytes),
          lines((r.bytes + 63) / 64) {}
    template <int kHint>
    void Step(int64_t steps) {
      for (error += lines; error >= steps; error -= steps, next += 64) {
        if (next >= end) continue;
        // Spelled out: g++ takes the hint as an enum type that clang does not have.
        if constexpr (kHint == _MM_HINT_T0) {
          _mm_prefetch(next, _MM_HINT_T0);
        } else {
          _mm_prefetch(next, _MM_HINT_T1);
        }
      }
    }
    const char* next;
    const char* end;
    int64_t lines;
    int64_t error = 0;
  };
  Stream near_;
  Stream far_;
  int64_t steps_;
};

// Whether batched blocks also prefetch the chunk after next (into L2) for panels of `dtype`:
// for f32, whose 8 KiB chunk is 32 k steps, yes; a half chunk is 64 k steps, long enough for
// the next chunk's L1 prefetches alone, and there the extra instructions cost more than the
// far stream gains.
constexpr bool PrefetchFarChunk(DType dtype) { return dtype == DType::kF32; }

// The prefetches of a batched block that multiplies the K chunk of a panel (`k` rows of
// `row_bytes`, `chunk` rows a chunk) that ends at row k1 in `steps` k steps: the next chunk
// into L1 and, when kFar, the one after into L2.
template <bool kFar>
inline PrefetchSpread ChunkPrefetch(const void* panel, int64_t row_bytes, int64_t k, int64_t k1,
                                    int64_t chunk, int64_t steps) {
  const char* p = static_cast<const char*>(panel);
  const int64_t next_end = std::min(k, k1 + chunk);
  const int64_t far_end = kFar ? std::min(k, next_end + chunk) : next_end;
  return PrefetchSpread({p + k1 * row_bytes, (next_end - k1) * row_bytes},
                        {p + next_end * row_bytes, (far_end - next_end) * row_bytes}, steps);
}

}  // namespace prefixd::internal

#endif  // PREFIXD_KERNELS_CPU_MATMUL_KERNELS_H_
