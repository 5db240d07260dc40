#include "kernels/cpu/matmul.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string_view>

#include "base/check.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/ops.h"

namespace prefixd {
namespace {

// Rows per prefill task: enough tasks for both threads even when N has few panels, while a
// task's A rows (96 x K floats) and one panel both stay in L2.
constexpr int64_t kRowsPerTask = 96;

std::atomic<MatMulIsa> g_isa{MatMulIsa::kAuto};

// kAuto's answer: AVX-512 where the CPU has it, unless PREFIXD_CPU_ISA=avx2 asks for the
// baseline.
bool AutoPicksAvx512() {
  static const bool avx512 = [] {
    const char* env = std::getenv("PREFIXD_CPU_ISA");
    const std::string_view want = env == nullptr ? "" : env;
    if (want == "avx2") return false;
    if (!want.empty() && want != "auto" && want != "avx512") {
      std::fprintf(stderr, "prefixd: ignoring PREFIXD_CPU_ISA=%s (not auto, avx2 or avx512)\n",
                   env);
    }
    if (want == "avx512" && !internal::CpuHasAvx512()) {
      std::fprintf(stderr, "prefixd: PREFIXD_CPU_ISA=avx512 but this CPU lacks it; using AVX2\n");
    }
    return internal::CpuHasAvx512();
  }();
  return avx512;
}

bool UseAvx512() {
  switch (g_isa.load(std::memory_order_relaxed)) {
    case MatMulIsa::kAuto:
      return AutoPicksAvx512();
    case MatMulIsa::kAvx512:
      return internal::CpuHasAvx512();
    case MatMulIsa::kAvx2:
      return false;
  }
  return false;
}

void* AllocateAligned(size_t bytes_wanted) {
  // Big buffers (packed weights, the KV pool) go on 2 MiB pages where the kernel allows: a
  // decode step streams ~500 MB of panels, and with 4 KiB pages every page is a TLB miss and
  // a point where the hardware prefetcher stops.
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t align = bytes_wanted >= 2 * kHugePage ? kHugePage : 64;
  size_t bytes = std::max<size_t>(bytes_wanted, 64);
  bytes = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, bytes);
  PREFIXD_CHECK(p != nullptr);
  if (align == kHugePage) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure is fine
  std::memset(p, 0, bytes);
  return p;
}

}  // namespace

bool MatMulIsaSupported(MatMulIsa isa) {
  return isa != MatMulIsa::kAvx512 || internal::CpuHasAvx512();
}

void SetMatMulIsa(MatMulIsa isa) {
  PREFIXD_CHECK(MatMulIsaSupported(isa));
  g_isa.store(isa, std::memory_order_relaxed);
}

void AlignedFree::operator()(void* p) const { std::free(p); }

AlignedFloats AllocateFloats(size_t n) {
  return AlignedFloats(static_cast<float*>(AllocateAligned(n * sizeof(float))));
}

AlignedBytes AllocateBytes(size_t n) {
  return AlignedBytes(static_cast<std::byte*>(AllocateAligned(n)));
}

float RoundToDType(float x, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return x;
    case DType::kF16:
      return HalfToFloat(FloatToHalf(x));
    case DType::kBF16:
      return BF16ToFloat(FloatToBF16(x));
  }
  return x;
}

PackedMatrix PackedMatrix::Pack(const float* w, int64_t k, int64_t n, bool transposed,
                                DType dtype) {
  PackedMatrix m;
  m.k_ = k;
  m.n_ = n;
  m.dtype_ = dtype;
  const int64_t elems = m.num_panels() * k * kPanelWidth;
  m.data_ = AllocateBytes(static_cast<size_t>(elems * DTypeSize(dtype)));
  float* f32 = reinterpret_cast<float*>(m.data_.get());
  uint16_t* half = reinterpret_cast<uint16_t*>(m.data_.get());
  for (int64_t j = 0; j < m.num_panels(); ++j) {
    const int64_t base = j * k * kPanelWidth;
    const int64_t cols = std::min(kPanelWidth, n - j * kPanelWidth);
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t nn = j * kPanelWidth + c;
        const float x = transposed ? w[nn * k + kk] : w[kk * n + nn];
        const int64_t at = base + kk * kPanelWidth + c;
        switch (dtype) {
          case DType::kF32:
            f32[at] = x;
            break;
          case DType::kF16:
            half[at] = FloatToHalf(x);
            break;
          case DType::kBF16:
            half[at] = FloatToBF16(x);
            break;
        }
      }
    }
  }
  return m;
}

float PackedMatrix::at(int64_t kk, int64_t nn) const {
  const int64_t i = (nn / kPanelWidth) * k_ * kPanelWidth + kk * kPanelWidth + nn % kPanelWidth;
  switch (dtype_) {
    case DType::kF32:
      return reinterpret_cast<const float*>(data_.get())[i];
    case DType::kF16:
      return HalfToFloat(reinterpret_cast<const uint16_t*>(data_.get())[i]);
    case DType::kBF16:
      return BF16ToFloat(reinterpret_cast<const uint16_t*>(data_.get())[i]);
  }
  return 0;
}

void PackedMatrix::CopyColumn(int64_t nn, float* out) const {
  PREFIXD_CHECK(nn >= 0 && nn < n_);
  const int64_t first = (nn / kPanelWidth) * k_ * kPanelWidth + nn % kPanelWidth;
  switch (dtype_) {
    case DType::kF32: {
      const float* p = reinterpret_cast<const float*>(data_.get()) + first;
      for (int64_t kk = 0; kk < k_; ++kk) out[kk] = p[kk * kPanelWidth];
      return;
    }
    case DType::kF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(data_.get()) + first;
      for (int64_t kk = 0; kk < k_; ++kk) out[kk] = HalfToFloat(p[kk * kPanelWidth]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(data_.get()) + first;
      for (int64_t kk = 0; kk < k_; ++kk) out[kk] = BF16ToFloat(p[kk * kPanelWidth]);
      return;
    }
  }
}

namespace {

// c[r, col0 .. col0 + cols) = out[r - row_begin, :cols] + bias (or gelu of it, or += it), for
// r in [row_begin, row_end).
void StoreRows(const float* out, int64_t row_begin, int64_t row_end, int64_t col0, int64_t cols,
               const float* bias, float* c, int64_t ldc, MatMulOutput output) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* dst = c + r * ldc + col0;
    const float* src = out + (r - row_begin) * kPanelWidth;
    switch (output) {
      case MatMulOutput::kStore:
      case MatMulOutput::kGelu:
        if (bias != nullptr) {
          for (int64_t cc = 0; cc < cols; ++cc) dst[cc] = src[cc] + bias[col0 + cc];
        } else {
          std::memcpy(dst, src, cols * sizeof(float));
        }
        // Element-wise, each element through the same instructions wherever it falls, so a
        // panel's columns give the bits of the whole row.
        if (output == MatMulOutput::kGelu) GeluNewInPlace(dst, cols);
        break;
      case MatMulOutput::kAddTo:
        if (bias != nullptr) {
          for (int64_t cc = 0; cc < cols; ++cc) dst[cc] += src[cc] + bias[col0 + cc];
        } else {
          for (int64_t cc = 0; cc < cols; ++cc) dst[cc] += src[cc];
        }
        break;
    }
  }
}

}  // namespace

void MatMul(const float* a, int64_t m, int64_t lda, const PackedMatrix& w, const float* bias,
            float* c, int64_t ldc, ThreadPool* pool, MatMulOutput output) {
  if (m <= 0) return;
  const int64_t panels = w.num_panels();
  const int64_t n = w.n();
  const bool avx512 = UseAvx512();
  auto panel = [&w](int64_t j) { return internal::PanelRef{w.panel(j), w.dtype(), w.k()}; };
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
      internal::PanelsFewRowsAvx512(a, lda, m, panel(j), count, out);
      for (int64_t s = 0; s < count; ++s) {
        const int64_t col0 = (j + s) * kPanelWidth;
        StoreRows(out + s * m * kPanelWidth, 0, m, col0, std::min(kPanelWidth, n - col0), bias, c,
                  ldc, output);
      }
    });
  }
  // AVX2 has no few-row kernel: from 2 rows on, its batched blocks (chunked, prefetched)
  // stream better than the prefill blocks (bench/matmul_bench --isa avx2 --rows 2,3).
  const int64_t min_batch_rows = avx512 ? internal::kMinBatchRows : 2;
  if (m >= min_batch_rows && m <= internal::kMaxBatchRows) {
    // Batched decode: one task per panel, all rows.
    return run(panels, [&](int64_t j) {
      alignas(64) float out[internal::kMaxBatchRows * kPanelWidth];
      if (avx512) {
        internal::PanelBatchAvx512(a, m, lda, panel(j), out);
      } else {
        internal::PanelBatchAvx2(a, m, lda, panel(j), out);
      }
      const int64_t col0 = j * kPanelWidth;
      StoreRows(out, 0, m, col0, std::min(kPanelWidth, n - col0), bias, c, ldc, output);
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
        rows = left <= internal::kMaxRowsAvx512 ? left : std::min<int64_t>(6, left);
        internal::PanelRowsAvx512(a + r0 * lda, rows, lda, panel(j),
                                  /*prefetch=*/r0 == row_begin,
                                  out + (r0 - row_begin) * kPanelWidth);
      }
    } else {
      for (int64_t r0 = row_begin, rows = 0; r0 < row_end; r0 += rows) {
        rows = std::min(internal::kMaxRowsAvx2, row_end - r0);
        internal::PanelRowsAvx2(a + r0 * lda, rows, lda, panel(j),
                                out + (r0 - row_begin) * kPanelWidth);
      }
    }
    const int64_t col0 = j * kPanelWidth;
    StoreRows(out, row_begin, row_end, col0, std::min(kPanelWidth, n - col0), bias, c, ldc, output);
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
