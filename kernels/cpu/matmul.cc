#include "kernels/cpu/matmul.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/ops.h"

namespace prefixd {
namespace {

// Rows per prefill task: enough tasks for both threads even when N has few panels, while a
// task's A rows (96 x K floats) and one panel both stay in L2.
constexpr int64_t kRowsPerTask = 96;

std::atomic<MatMulIsa> g_isa{MatMulIsa::kAuto};

// The best of the register-block sets this CPU has: AMX over AVX-512, else AVX-512, else AVX2
// with AVX-VNNI, else AVX2.
MatMulIsa BestIsa() {
  if (internal::CpuHasAmx()) return MatMulIsa::kAmx;
  if (internal::CpuHasAvx512()) return MatMulIsa::kAvx512;
  if (internal::CpuHasAvxVnni()) return MatMulIsa::kAvxVnni;
  return MatMulIsa::kAvx2;
}

// kAuto's answer: PREFIXD_CPU_ISA's choice where the CPU has it, else BestIsa().
MatMulIsa AutoIsa() {
  static const MatMulIsa isa = [] {
    const char* env = std::getenv("PREFIXD_CPU_ISA");
    const std::optional<MatMulIsa> want =
        env == nullptr ? MatMulIsa::kAuto : ParseMatMulIsa(env);
    if (!want.has_value()) {
      std::fprintf(stderr,
                   "prefixd: ignoring PREFIXD_CPU_ISA=%s (not auto, avx2, avxvnni, avx512 or amx)\n",
                   env);
      return BestIsa();
    }
    if (*want == MatMulIsa::kAuto) return BestIsa();
    // (amx is supported with emulated tiles only where a test turned them on first.)
    if (MatMulIsaSupported(*want)) return *want;
    // A lesser set than asked where one exists (AVX-VNNI's is AVX2), else the best this CPU
    // has (amx without AMX: avx512).
    const MatMulIsa fallback = *want == MatMulIsa::kAvxVnni ? MatMulIsa::kAvx2 : BestIsa();
    std::fprintf(stderr, "prefixd: PREFIXD_CPU_ISA=%s but this CPU lacks it; using %s\n", env,
                 MatMulIsaName(fallback));
    return fallback;
  }();
  return isa;
}

MatMulIsa Isa() {
  const MatMulIsa isa = g_isa.load(std::memory_order_relaxed);
  return isa == MatMulIsa::kAuto ? AutoIsa() : isa;
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

const char* MatMulIsaName(MatMulIsa isa) {
  switch (isa) {
    case MatMulIsa::kAmx:
      return "amx";
    case MatMulIsa::kAvx512:
      return "avx512";
    case MatMulIsa::kAvxVnni:
      return "avxvnni";
    case MatMulIsa::kAvx2:
      return "avx2";
    case MatMulIsa::kAuto:
      break;
  }
  return "auto";
}

std::optional<MatMulIsa> ParseMatMulIsa(std::string_view name) {
  for (MatMulIsa isa : {MatMulIsa::kAuto, MatMulIsa::kAvx2, MatMulIsa::kAvxVnni,
                        MatMulIsa::kAvx512, MatMulIsa::kAmx}) {
    if (name == MatMulIsaName(isa)) return isa;
  }
  return std::nullopt;
}

bool MatMulIsaSupported(MatMulIsa isa) {
  switch (isa) {
    case MatMulIsa::kAmx:
      return internal::CpuHasAmx() || internal::AmxEmulated();
    case MatMulIsa::kAvx512:
      return internal::CpuHasAvx512();
    case MatMulIsa::kAvxVnni:
      return internal::CpuHasAvxVnni();
    case MatMulIsa::kAuto:
    case MatMulIsa::kAvx2:
      return true;
  }
  return false;
}

void SetMatMulIsa(MatMulIsa isa) {
  PREFIXD_CHECK(MatMulIsaSupported(isa));
  g_isa.store(isa, std::memory_order_relaxed);
}

void SetAmxEmulationForTesting(bool on) {
  if (on && !internal::CpuHasAvx512Vnni()) return;  // kAmx stays unsupported
  internal::SetAmxEmulation(on);
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
    case DType::kI8:
      return x;
    case DType::kF16:
      return HalfToFloat(FloatToHalf(x));
    case DType::kBF16:
      return BF16ToFloat(FloatToBF16(x));
  }
  return x;
}

float QuantizeInt8Block(const float* x, int64_t n, int8_t* q) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  const float inv = m > 0.0f ? 127.0f / m : 0.0f;
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * inv));
  return m / 127.0f;
}

int64_t PackedMatrix::panel_bytes() const {
  if (dtype_ == DType::kI8) {
    return (k_ + kInt8BlockK - 1) / kInt8BlockK * internal::kInt8BlockBytes;
  }
  return k_ * kPanelWidth * DTypeSize(dtype_);
}

namespace {

// Byte offset of W[kk, c] in an int8 panel (c < kPanelWidth): block, quad row, column, lane.
int64_t Int8Offset(int64_t kk, int64_t c) {
  const int64_t in_block = kk % kInt8BlockK;
  return kk / kInt8BlockK * internal::kInt8BlockBytes + in_block / 4 * internal::kInt8QuadRowBytes +
         c * 4 + in_block % 4;
}

float Int8Scale(const std::byte* panel, int64_t kk, int64_t c) {
  float s;
  std::memcpy(&s,
              panel + kk / kInt8BlockK * internal::kInt8BlockBytes +
                  internal::kInt8BlockWeightBytes + c * 4,
              4);
  return s;
}

// Stored bytes are qw + 128 (what vpdpbusd's unsigned operand takes; matmul_int8.h).
float Int8At(const std::byte* panel, int64_t kk, int64_t c) {
  const int q = static_cast<int>(static_cast<uint8_t>(panel[Int8Offset(kk, c)])) - 128;
  return static_cast<float>(q) * Int8Scale(panel, kk, c);
}

void PackInt8(const float* w, int64_t k, int64_t n, bool transposed, std::byte* data,
              int64_t panel_bytes) {
  std::fill(data, data + panel_bytes * ((n + kPanelWidth - 1) / kPanelWidth), std::byte{128});
  float block[kInt8BlockK];
  int8_t q[kInt8BlockK];
  for (int64_t nn = 0; nn < n; ++nn) {
    std::byte* panel = data + nn / kPanelWidth * panel_bytes;
    const int64_t c = nn % kPanelWidth;
    for (int64_t k0 = 0; k0 < k; k0 += kInt8BlockK) {
      const int64_t len = std::min(kInt8BlockK, k - k0);
      for (int64_t i = 0; i < len; ++i) {
        block[i] = transposed ? w[nn * k + k0 + i] : w[(k0 + i) * n + nn];
      }
      const float scale = QuantizeInt8Block(block, len, q);
      for (int64_t i = 0; i < len; ++i) {
        panel[Int8Offset(k0 + i, c)] = static_cast<std::byte>(static_cast<uint8_t>(q[i] + 128));
      }
      std::memcpy(panel + k0 / kInt8BlockK * internal::kInt8BlockBytes +
                      internal::kInt8BlockWeightBytes + c * 4,
                  &scale, 4);
    }
  }
}

}  // namespace

PackedMatrix PackedMatrix::Pack(const float* w, int64_t k, int64_t n, bool transposed,
                                DType dtype) {
  PackedMatrix m;
  m.k_ = k;
  m.n_ = n;
  m.dtype_ = dtype;
  m.data_ = AllocateBytes(m.size_bytes());
  if (dtype == DType::kI8) {
    PackInt8(w, k, n, transposed, m.data_.get(), m.panel_bytes());
    return m;
  }
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
          case DType::kI8:  // packed above
            break;
        }
      }
    }
  }
  return m;
}

float PackedMatrix::at(int64_t kk, int64_t nn) const {
  if (dtype_ == DType::kI8) {
    return Int8At(data_.get() + nn / kPanelWidth * panel_bytes(), kk, nn % kPanelWidth);
  }
  const int64_t i = (nn / kPanelWidth) * k_ * kPanelWidth + kk * kPanelWidth + nn % kPanelWidth;
  switch (dtype_) {
    case DType::kF32:
      return reinterpret_cast<const float*>(data_.get())[i];
    case DType::kF16:
      return HalfToFloat(reinterpret_cast<const uint16_t*>(data_.get())[i]);
    case DType::kBF16:
      return BF16ToFloat(reinterpret_cast<const uint16_t*>(data_.get())[i]);
    case DType::kI8:
      break;
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
    case DType::kI8: {
      const std::byte* panel = data_.get() + nn / kPanelWidth * panel_bytes();
      for (int64_t kk = 0; kk < k_; ++kk) out[kk] = Int8At(panel, kk, nn % kPanelWidth);
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

// QuantizeInt8Block over one row's blocks, in AVX2 (one instruction sequence for every block,
// a short last one through a zero-padded copy): the same bits as the scalar function, since
// max is exact in any order, 127 / m and x * inv are single IEEE operations, and vcvtps2dq
// rounds to nearest even as nearbyint does. q gets whole blocks (zeros past k).
void QuantizeRowInt8(const float* x, int64_t k, int8_t* q, float* scale, int32_t* sum) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t k0 = 0, b = 0; k0 < k; k0 += kInt8BlockK, ++b) {
    alignas(32) float padded[kInt8BlockK];
    const float* p = x + k0;
    if (k - k0 < kInt8BlockK) {
      std::fill(padded, padded + kInt8BlockK, 0.0f);
      std::memcpy(padded, p, (k - k0) * sizeof(float));
      p = padded;
    }
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(p + 8 * i);
    __m256 mx =
        _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                      _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    float m = 0.0f;
    for (float l : lanes) m = std::max(m, l);
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    scale[b] = m / 127.0f;
    __m256i qi[4];
    for (int i = 0; i < 4; ++i)
      qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
    const __m256i s =
        _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    alignas(32) int32_t s_lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s_lanes), s);
    int32_t total = 0;
    for (int32_t l : s_lanes) total += l;
    sum[b] = total;
    // packs interleave 128-bit lanes; the permutation restores element order.
    const __m256i bytes =
        _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k0),
                        _mm256_permutevar8x32_epi32(bytes, order));
  }
}

// Quantized activations of an int8 MatMul, one set per calling thread, reused across calls.
struct Int8Scratch {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
};

// The int8 blocks for an instruction-set choice: AVX-512's need VNNI too (else AVX-VNNI's or
// AVX2's serve); all give the same bits.
enum class Int8Kernel { kAvx2, kAvxVnni, kAvx512Vnni, kAmx };
Int8Kernel Int8KernelFor(MatMulIsa isa) {
  if (isa == MatMulIsa::kAmx) return Int8Kernel::kAmx;  // supported implies AVX-512 VNNI
  if (isa == MatMulIsa::kAvx512 && internal::CpuHasAvx512Vnni()) return Int8Kernel::kAvx512Vnni;
  if (isa != MatMulIsa::kAvx2 && internal::CpuHasAvxVnni()) return Int8Kernel::kAvxVnni;
  return Int8Kernel::kAvx2;
}

// Rows quantized by one task when MatMul spreads the quantization over the pool.
constexpr int64_t kQuantizeRowsPerTask = 32;

void MatMulInt8(const float* a, int64_t m, int64_t lda, const PackedMatrix& w, const float* bias,
                float* c, int64_t ldc, MatMulOutput output, Int8Kernel kernel,
                const std::function<void(int64_t, const std::function<void(int64_t)>&)>& run) {
  const int64_t k = w.k(), n = w.n(), panels = w.num_panels();
  const int64_t blocks = (k + kInt8BlockK - 1) / kInt8BlockK;
  // The calling thread's buffers, by reference: inside the tasks below the name of a
  // thread_local would mean the worker's own.
  thread_local Int8Scratch thread_scratch;
  Int8Scratch& scratch = thread_scratch;
  scratch.q.resize(static_cast<size_t>(m * blocks * kInt8BlockK));
  scratch.scale.resize(static_cast<size_t>(m * blocks));
  scratch.sum.resize(static_cast<size_t>(m * blocks));
  const internal::Int8Rows rows{scratch.q.data(), scratch.scale.data(), scratch.sum.data(),
                                blocks * kInt8BlockK, blocks};
  auto quantize = [&](int64_t t) {
    for (int64_t r = t * kQuantizeRowsPerTask; r < std::min(m, (t + 1) * kQuantizeRowsPerTask);
         ++r) {
      QuantizeRowInt8(a + r * lda, k, scratch.q.data() + r * rows.q_stride,
                      scratch.scale.data() + r * blocks, scratch.sum.data() + r * blocks);
    }
  };
  const int64_t quantize_tasks = (m + kQuantizeRowsPerTask - 1) / kQuantizeRowsPerTask;
  if (quantize_tasks > 1) {
    run(quantize_tasks, quantize);
  } else {
    quantize(0);
  }
  auto product = [&](int64_t j, int64_t row_begin, int64_t row_end, float* out) {
    const internal::PanelRef panel{w.panel(j), w.dtype(), k};
    switch (kernel) {
      case Int8Kernel::kAmx:
        internal::PanelInt8Amx(rows, row_begin, row_end - row_begin, panel, out);
        break;
      case Int8Kernel::kAvx512Vnni:
        internal::PanelInt8Avx512(rows, row_begin, row_end - row_begin, panel, out);
        break;
      case Int8Kernel::kAvxVnni:
        internal::PanelInt8AvxVnni(rows, row_begin, row_end - row_begin, panel, out);
        break;
      case Int8Kernel::kAvx2:
        internal::PanelInt8Avx2(rows, row_begin, row_end - row_begin, panel, out);
        break;
    }
    const int64_t col0 = j * kPanelWidth;
    StoreRows(out, row_begin, row_end, col0, std::min(kPanelWidth, n - col0), bias, c, ldc, output);
  };
  if (m <= internal::kMaxBatchRows) {
    // Decode, batched or not: one task per panel, all rows.
    return run(panels, [&](int64_t j) {
      alignas(64) float out[internal::kMaxBatchRows * kPanelWidth];
      for (int64_t r0 = 0; r0 < m; r0 += internal::kMaxBatchRows) {
        product(j, r0, std::min(m, r0 + internal::kMaxBatchRows), out);
      }
    });
  }
  const int64_t row_tasks = (m + kRowsPerTask - 1) / kRowsPerTask;
  run(panels * row_tasks, [&](int64_t t) {
    alignas(64) float out[kRowsPerTask * kPanelWidth];
    const int64_t row_begin = (t / panels) * kRowsPerTask;
    for (int64_t r0 = row_begin; r0 < std::min(m, row_begin + kRowsPerTask);
         r0 += internal::kMaxBatchRows) {
      const int64_t r1 = std::min({m, row_begin + kRowsPerTask, r0 + internal::kMaxBatchRows});
      product(t % panels, r0, r1, out + (r0 - row_begin) * kPanelWidth);
    }
  });
}

}  // namespace

void MatMul(const float* a, int64_t m, int64_t lda, const PackedMatrix& w, const float* bias,
            float* c, int64_t ldc, ThreadPool* pool, MatMulOutput output) {
  if (m <= 0) return;
  const int64_t panels = w.num_panels();
  const int64_t n = w.n();
  const MatMulIsa isa = Isa();
  const bool avx512 = isa == MatMulIsa::kAvx512 || isa == MatMulIsa::kAmx;
  auto panel = [&w](int64_t j) { return internal::PanelRef{w.panel(j), w.dtype(), w.k()}; };
  auto run = [pool](int64_t tasks, const std::function<void(int64_t)>& fn) {
    if (pool != nullptr) {
      pool->Run(tasks, fn);
    } else {
      for (int64_t t = 0; t < tasks; ++t) fn(t);
    }
  };
  if (w.dtype() == DType::kI8) {
    return MatMulInt8(a, m, lda, w, bias, c, ldc, output, Int8KernelFor(isa), run);
  }
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

std::string MatMulIsaInUse() {
  const MatMulIsa isa = Isa();
  std::string name = MatMulIsaName(isa);
  if (isa == MatMulIsa::kAmx && internal::AmxEmulated()) name += " (emulated tiles)";
  const Int8Kernel int8 = Int8KernelFor(isa);
  if (isa == MatMulIsa::kAvx512 && int8 != Int8Kernel::kAvx512Vnni) {
    name += int8 == Int8Kernel::kAvxVnni ? " (int8: avxvnni)" : " (int8: avx2)";
  }
  return name;
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

void MatMulReferenceInt8(const float* a, int64_t m, int64_t lda, const int8_t* wq, const float* ws,
                         int64_t k, int64_t n, const float* bias, float* c, int64_t ldc) {
  const int64_t blocks = (k + kInt8BlockK - 1) / kInt8BlockK;
  std::vector<int8_t> qa(static_cast<size_t>(k));
  std::vector<float> sa(static_cast<size_t>(blocks));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * kInt8BlockK;
      sa[b] = QuantizeInt8Block(a + r * lda + k0, std::min(kInt8BlockK, k - k0), qa.data() + k0);
    }
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t sum = 0;
        for (int64_t kk = b * kInt8BlockK; kk < std::min(k, (b + 1) * kInt8BlockK); ++kk) {
          sum += int32_t{qa[kk]} * int32_t{wq[kk * n + j]};
        }
        acc = std::fma(static_cast<float>(sum), sa[b] * ws[b * n + j], acc);
      }
      c[r * ldc + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
}

}  // namespace prefixd
