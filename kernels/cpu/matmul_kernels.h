// The register blocks behind MatMul (matmul.cc), one set per instruction set: AVX2 + FMA +
// F16C (matmul_avx2.cc, the baseline this library is built for) and AVX-512
// (matmul_avx512.cc, chosen at run time on CPUs that have avx512f and avx512vl). Internal to
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

#include <cstdint>

#include "engine/dtype.h"

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

// Spreads the prefetches of `bytes` from `begin` (the next K chunk) evenly over `steps` k
// steps (every pass of every row block over this chunk): one burst would fill the core's
// queue of outstanding misses and stall the arithmetic behind it, then leave the memory idle
// for the rest of the chunk. Step() is Bresenham's line: `lines` prefetches per `steps`.
class PrefetchSpread {
 public:
  PrefetchSpread(const void* begin, int64_t bytes, int64_t steps)
      : next_(static_cast<const char*>(begin)),
        end_(next_ + bytes),
        lines_((bytes + 63) / 64),
        steps_(steps) {}
  void Step() {
    for (error_ += lines_; error_ >= steps_; error_ -= steps_, next_ += 64) {
      if (next_ < end_) _mm_prefetch(next_, _MM_HINT_T0);
    }
  }

 private:
  const char* next_;
  const char* end_;
  int64_t lines_;
  int64_t steps_;
  int64_t error_ = 0;
};

}  // namespace prefixd::internal

#endif  // PREFIXD_KERNELS_CPU_MATMUL_KERNELS_H_
