// AVX-512 register blocks for MatMul (matmul.cc), chosen at run time on CPUs that have
// avx512f and avx512vl. Internal to kernels/cpu.
//
// Invariant: same per-element arithmetic as the AVX2 blocks in matmul.cc and the scalar
// MatMulReference: out[r, c] = fma chain over k = 0..K-1 in order, starting from +0.0f. Only
// the number of columns per instruction changes (16 instead of 8), which no element can see,
// so the two paths give identical bits (matmul_test checks both against the reference).
#ifndef PREFIXD_KERNELS_CPU_MATMUL_AVX512_H_
#define PREFIXD_KERNELS_CPU_MATMUL_AVX512_H_

#include <cstdint>

namespace prefixd::internal {

// Most rows PanelRowsAvx512 takes in one call.
inline constexpr int64_t kMaxRowsAvx512 = 8;

// out[r, 0..64) = a[r, 0..k) · panel for r in [0, rows), 1 <= rows <= kMaxRowsAvx512. `panel`
// is one packed K x 64 panel (64-byte aligned); `out` is [rows, 64], 64-byte aligned.
// `prefetch`: the panel is probably not in cache yet (prefetch ahead of the loads), as for a
// task's first row block; false when an earlier block just read it. Only call when
// CpuHasAvx512() is true.
void PanelRowsAvx512(const float* a, int64_t rows, int64_t lda, const float* panel, int64_t k,
                     bool prefetch, float* out);

// Most rows PanelsFewRowsAvx512 takes.
inline constexpr int64_t kMaxFewRowsAvx512 = 3;

// out[(j * rows + r) * 64 + c] = a[r, 0..k) · panel j, column c, for the `num_panels` (1 or 2)
// consecutive panels starting at `panel` (the packed layout keeps them k * 64 floats apart)
// and 1 <= rows <= kMaxFewRowsAvx512: decode batches, where the product is a stream of the
// weights from memory. Two panels walked side by side are two independent streams, which
// keeps more cache misses in flight than one. `out` is 64-byte aligned.
void PanelsFewRowsAvx512(const float* a, int64_t lda, int64_t rows, const float* panel,
                         int64_t num_panels, int64_t k, float* out);

bool CpuHasAvx512();

}  // namespace prefixd::internal

#endif  // PREFIXD_KERNELS_CPU_MATMUL_AVX512_H_
