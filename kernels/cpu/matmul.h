// Batch-invariant matrix products with fp32 arithmetic: C[M, N] = A[M, K] · W[K, N] + bias[N].
//
// Invariant: every output element C[m, n] is exactly
//   acc = 0; for k in 0..K-1: acc = fma(A[m, k], W[k, n], acc);  C[m, n] = acc + bias[n]
// whatever M, the row's position in the batch, the number of threads, the instruction set or
// the code path (6-row prefill blocks, the few-row decode stream, the batched-decode blocks,
// partial tails). MatMulReference is that loop in scalar code and the tests compare the two
// with ==. This is what makes a sequence's logits independent of what else shares its batch
// and of whether its prefix was cached.
//
// W is packed once at load time from Hugging Face's [in, out] layout into column panels of
// kPanelWidth: panel j holds W[0..K, 64j..64j+64) row-major (K x 64, zero-padded past N), so
// every register block reads it contiguously. Threads split panels (and row blocks), never K.
// The panels hold f32, or f16 / bf16 (half the bytes to stream per decode step): a half weight
// is widened to fp32 in a register, exactly, so W above is then the half-rounded matrix and
// A, the accumulation and C stay fp32.
#ifndef PREFIXD_KERNELS_CPU_MATMUL_H_
#define PREFIXD_KERNELS_CPU_MATMUL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/dtype.h"
#include "kernels/cpu/thread_pool.h"

namespace prefixd {

inline constexpr int64_t kPanelWidth = 64;

// 64-byte aligned buffers (aligned loads; whole cache lines per panel row), zero-filled. Big
// ones go on 2 MiB pages where the kernel allows.
struct AlignedFree {
  void operator()(void* p) const;
};
using AlignedFloats = std::unique_ptr<float[], AlignedFree>;
AlignedFloats AllocateFloats(size_t n);
using AlignedBytes = std::unique_ptr<std::byte[], AlignedFree>;
AlignedBytes AllocateBytes(size_t n);

class PackedMatrix {
 public:
  PackedMatrix() = default;
  // `w` is row-major [k, n] (HF Conv1D layout). `transposed` = true packs w^T instead, for a
  // row-major [n, k] source (the tied LM head reads wte [V, E] as [E, V]). `dtype`: the
  // element type of the panels; f16 and bf16 round each weight to nearest even.
  static PackedMatrix Pack(const float* w, int64_t k, int64_t n, bool transposed,
                           DType dtype = DType::kF32);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  DType dtype() const { return dtype_; }
  int64_t num_panels() const { return (n_ + kPanelWidth - 1) / kPanelWidth; }
  // Panel j's first element (of dtype()).
  const void* panel(int64_t j) const {
    return data_.get() + j * k_ * kPanelWidth * DTypeSize(dtype_);
  }
  // Element W[kk, nn] as fp32 (what the products multiply by).
  float at(int64_t kk, int64_t nn) const;
  // out[kk] = at(kk, nn) for kk in [0, k): column nn, e.g. a row of the source of a
  // transposed pack (an embedding of the tied wte).
  void CopyColumn(int64_t nn, float* out) const;
  size_t size_bytes() const {
    return static_cast<size_t>(num_panels() * k_ * kPanelWidth * DTypeSize(dtype_));
  }

 private:
  int64_t k_ = 0;
  int64_t n_ = 0;
  DType dtype_ = DType::kF32;
  AlignedBytes data_;
};

// `x` rounded to `dtype` and widened back to fp32 (identity for f32): the value a weight
// packed at that dtype multiplies by.
float RoundToDType(float x, DType dtype);

// What MatMul does with each output element y = A[m, :] · W + bias (rounded to fp32 first,
// so that a fused form gives the bits of the product followed by a separate pass): store it,
// store gelu_new(y) (GeluNewInPlace's arithmetic), or add it to C (a residual connection).
// Fusing saves the separate pass over C and, in a step of a few rows, a round of the pool.
enum class MatMulOutput { kStore, kGelu, kAddTo };

// C[m, :] = A[m, :] · W + bias for m in [0, M) (or gelu of it, or C += it: `output`).
// `bias` may be null (no bias term). lda/ldc are row strides in floats. `pool` may be null
// (single thread).
void MatMul(const float* a, int64_t m, int64_t lda, const PackedMatrix& w, const float* bias,
            float* c, int64_t ldc, ThreadPool* pool, MatMulOutput output = MatMulOutput::kStore);

// Which register blocks MatMul uses: kAuto takes AVX-512 where the CPU has it (avx512f and
// avx512vl), else AVX2 (+ FMA + F16C, the baseline this library is built for). Every choice
// gives identical bits (the invariant above); the setting exists so that tests can run each
// path on one machine and benchmarks can compare them. The environment variable
// PREFIXD_CPU_ISA=avx2 makes kAuto pick AVX2, for running a whole program (a server, a test
// suite) as it would run on a CPU without AVX-512.
enum class MatMulIsa { kAuto, kAvx2, kAvx512 };
bool MatMulIsaSupported(MatMulIsa isa);
// Process-wide. PREFIXD_CHECKs that `isa` is supported. Not to be called while a MatMul runs.
void SetMatMulIsa(MatMulIsa isa);

// The obviously-right twin: scalar fmaf chain with K in order, from the unpacked [k, n] fp32
// matrix (for a half-precision PackedMatrix, pass w with each element RoundToDType'd).
void MatMulReference(const float* a, int64_t m, int64_t lda, const float* w, int64_t k, int64_t n,
                     const float* bias, float* c, int64_t ldc);

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CPU_MATMUL_H_
