#include "kernels/cpu/matmul.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "base/check.h"
#include "kernels/cpu/matmul_avx512.h"

namespace prefixd {
namespace {

constexpr int64_t kMaxRows = 6;  // rows per register block in prefill
// Rows per task: enough tasks for both threads even when N has few panels, while a task's
// A rows (96 x K floats) and one panel both stay in L2.
constexpr int64_t kRowsPerTask = 96;

// acc[r][c] = sum_k a[r, k] * p[k, c] as one fma chain per element, K in order, for R rows
// and NV*8 columns starting at `p` (a panel plus a column offset; row stride kPanelWidth).
template <int R, int NV>
inline void MicroKernel(const float* a, int64_t lda, const float* p, int64_t k, float* out) {
  __m256 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* prow = p + kk * kPanelWidth;
    __m256 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm256_load_ps(prow + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + r * kPanelWidth + 8 * v, acc[r][v]);
}

// Full 64-column panel for R rows: out is [R, kPanelWidth].
template <int R>
void PanelBlock(const float* a, int64_t lda, const float* panel, int64_t k, float* out) {
  // Register budget (16 ymm): R x NV accumulators + NV panel loads + 1 broadcast.
  constexpr int NV = R == 1 ? 8 : R == 2 ? 4 : 2;
  for (int64_t c = 0; c < kPanelWidth; c += 8 * NV) {
    MicroKernel<R, NV>(a, lda, panel + c, k, out + c);
  }
}

void PanelRows(const float* a, int64_t rows, int64_t lda, const float* panel, int64_t k,
               float* out) {
  switch (rows) {
    case 1:
      return PanelBlock<1>(a, lda, panel, k, out);
    case 2:
      return PanelBlock<2>(a, lda, panel, k, out);
    case 3:
      return PanelBlock<3>(a, lda, panel, k, out);
    case 4:
      return PanelBlock<4>(a, lda, panel, k, out);
    case 5:
      return PanelBlock<5>(a, lda, panel, k, out);
    case 6:
      return PanelBlock<6>(a, lda, panel, k, out);
  }
  PREFIXD_CHECK(false);
}

std::atomic<MatMulIsa> g_isa{MatMulIsa::kAuto};

bool UseAvx512() {
  switch (g_isa.load(std::memory_order_relaxed)) {
    case MatMulIsa::kAuto:
    case MatMulIsa::kAvx512:
      return internal::CpuHasAvx512();
    case MatMulIsa::kAvx2:
      return false;
  }
  return false;
}

}  // namespace

bool MatMulIsaSupported(MatMulIsa isa) {
  return isa != MatMulIsa::kAvx512 || internal::CpuHasAvx512();
}

void SetMatMulIsa(MatMulIsa isa) {
  PREFIXD_CHECK(MatMulIsaSupported(isa));
  g_isa.store(isa, std::memory_order_relaxed);
}

void AlignedFree::operator()(float* p) const { std::free(p); }

AlignedFloats AllocateFloats(size_t n) {
  // Big buffers (packed weights, the KV pool) go on 2 MiB pages where the kernel allows: a
  // decode step streams ~500 MB of panels, and with 4 KiB pages every page is a TLB miss and
  // a point where the hardware prefetcher stops.
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t align = n * sizeof(float) >= 2 * kHugePage ? kHugePage : 64;
  size_t bytes = std::max<size_t>(n * sizeof(float), 64);
  bytes = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, bytes);
  PREFIXD_CHECK(p != nullptr);
  if (align == kHugePage) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure is fine
  std::memset(p, 0, bytes);
  return AlignedFloats(static_cast<float*>(p));
}

PackedMatrix PackedMatrix::Pack(const float* w, int64_t k, int64_t n, bool transposed) {
  PackedMatrix m;
  m.k_ = k;
  m.n_ = n;
  m.data_ = AllocateFloats(static_cast<size_t>(m.num_panels() * k * kPanelWidth));
  for (int64_t j = 0; j < m.num_panels(); ++j) {
    float* dst = m.data_.get() + j * k * kPanelWidth;
    const int64_t cols = std::min(kPanelWidth, n - j * kPanelWidth);
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t nn = j * kPanelWidth + c;
        dst[kk * kPanelWidth + c] = transposed ? w[nn * k + kk] : w[kk * n + nn];
      }
    }
  }
  return m;
}

namespace {

// c[r, col0 .. col0 + cols) = out[r - row_begin, :cols] + bias, for r in [row_begin, row_end).
void StoreRows(const float* out, int64_t row_begin, int64_t row_end, int64_t col0, int64_t cols,
               const float* bias, float* c, int64_t ldc) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* dst = c + r * ldc + col0;
    const float* src = out + (r - row_begin) * kPanelWidth;
    if (bias != nullptr) {
      for (int64_t cc = 0; cc < cols; ++cc) dst[cc] = src[cc] + bias[col0 + cc];
    } else {
      std::memcpy(dst, src, cols * sizeof(float));
    }
  }
}

}  // namespace

void MatMul(const float* a, int64_t m, int64_t lda, const PackedMatrix& w, const float* bias,
            float* c, int64_t ldc, ThreadPool* pool) {
  if (m <= 0) return;
  const int64_t panels = w.num_panels();
  const int64_t k = w.k();
  const int64_t n = w.n();
  const bool avx512 = UseAvx512();
  auto run = [pool](int64_t tasks, const std::function<void(int64_t)>& fn) {
    if (pool != nullptr) {
      pool->Run(tasks, fn);
    } else {
      for (int64_t t = 0; t < tasks; ++t) fn(t);
    }
  };
  if (m <= internal::kMaxFewRowsAvx512 && avx512) {
    // Decode: a few rows stream the weights; a task takes two neighbouring panels.
    return run((panels + 1) / 2, [&](int64_t t) {
      const int64_t j = 2 * t;
      const int64_t count = std::min<int64_t>(2, panels - j);
      alignas(64) float out[2 * internal::kMaxFewRowsAvx512 * kPanelWidth];
      internal::PanelsFewRowsAvx512(a, lda, m, w.panel(j), count, k, out);
      for (int64_t s = 0; s < count; ++s) {
        const int64_t col0 = (j + s) * kPanelWidth;
        StoreRows(out + s * m * kPanelWidth, 0, m, col0, std::min(kPanelWidth, n - col0), bias,
                  c, ldc);
      }
    });
  }
  const int64_t row_tasks = (m + kRowsPerTask - 1) / kRowsPerTask;
  run(panels * row_tasks, [&](int64_t t) {
    const int64_t j = t % panels;
    const int64_t row_begin = (t / panels) * kRowsPerTask;
    const int64_t row_end = std::min(m, row_begin + kRowsPerTask);
    alignas(64) float out[kRowsPerTask * kPanelWidth];
    if (avx512) {
      for (int64_t r0 = row_begin, rows = 0; r0 < row_end; r0 += rows) {
        // 6-row blocks, except that 7 or 8 left go in one block (one pass over the panel).
        const int64_t left = row_end - r0;
        rows = left <= internal::kMaxRowsAvx512 ? left : std::min(kMaxRows, left);
        internal::PanelRowsAvx512(a + r0 * lda, rows, lda, w.panel(j), k,
                                  /*prefetch=*/r0 == row_begin,
                                  out + (r0 - row_begin) * kPanelWidth);
      }
    } else {
      for (int64_t r0 = row_begin, rows = 0; r0 < row_end; r0 += rows) {
        rows = std::min(kMaxRows, row_end - r0);
        PanelRows(a + r0 * lda, rows, lda, w.panel(j), k, out + (r0 - row_begin) * kPanelWidth);
      }
    }
    const int64_t col0 = j * kPanelWidth;
    StoreRows(out, row_begin, row_end, col0, std::min(kPanelWidth, n - col0), bias, c, ldc);
  });
}

void MatMulReference(const float* a, int64_t m, int64_t lda, const float* w, int64_t k, int64_t n,
                     const float* bias, float* c, int64_t ldc) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc = std::fma(a[r * lda + kk], w[kk * n + j], acc);
      c[r * ldc + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
}

}  // namespace prefixd
