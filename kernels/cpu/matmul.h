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
//
// int8 panels (DType::kI8) are the exception to the fp32 chain above; they keep their own
// invariant, which is just as independent of the path. Each column's weights are rounded in
// blocks of kInt8BlockK consecutive k to qw in [-127, 127] with one fp32 scale sw per block
// (QuantizeInt8Block: scale = max|w| / 127). MatMul rounds each row of A the same way
// (qa, sa per row and block), and every output element is
//   acc = 0; for each K block b in order:
//     acc = fma(float(sum over the block of qa[m, k] * qw[k, n]), sa[m, b] * sw[b, n], acc)
//   C[m, n] = acc + bias[n]
// The block sums are integers, exact on every instruction set (integer dot products of bytes:
// tdpbsud on AMX tiles, vpdpbusd with AVX-512 VNNI or AVX-VNNI, vpmaddubsw with AVX2), and the
// fp32 steps are the same ones in the same order everywhere: MatMulReferenceInt8 is the scalar
// twin. Why blocks of 32: llama.cpp's Q8_0 block, so the accuracy compares directly with it;
// one K block of a 64-column panel is 2 KiB of bytes and 256 B of scales (1.125 bytes a weight,
// 0.56 of f16's stream); longer blocks would save scale bytes but let one outlier coarsen the
// step of more weights, shorter ones cost scale bytes and an fp32 step per output more often.
// (|sum| <= 32 x 127 x 127 < 2^24, so float(sum) is exact.)
#ifndef PREFIXD_KERNELS_CPU_MATMUL_H_
#define PREFIXD_KERNELS_CPU_MATMUL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

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
  // element type of the panels; f16 and bf16 round each weight to nearest even, int8 rounds
  // each column's blocks of kInt8BlockK (QuantizeInt8Block).
  static PackedMatrix Pack(const float* w, int64_t k, int64_t n, bool transposed,
                           DType dtype = DType::kF32);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  DType dtype() const { return dtype_; }
  int64_t num_panels() const { return (n_ + kPanelWidth - 1) / kPanelWidth; }
  // Panel j's first element (of dtype()).
  const void* panel(int64_t j) const { return data_.get() + j * panel_bytes(); }
  // Element W[kk, nn] as fp32 (what the products multiply by; for int8, qw * sw).
  float at(int64_t kk, int64_t nn) const;
  // out[kk] = at(kk, nn) for kk in [0, k): column nn, e.g. a row of the source of a
  // transposed pack (an embedding of the tied wte).
  void CopyColumn(int64_t nn, float* out) const;
  size_t size_bytes() const { return static_cast<size_t>(num_panels() * panel_bytes()); }
  // Bytes of one panel: K x 64 elements, or for int8 ceil(K / kInt8BlockK) blocks of
  // kInt8BlockK x 64 bytes and 64 fp32 scales.
  int64_t panel_bytes() const;

 private:
  int64_t k_ = 0;
  int64_t n_ = 0;
  DType dtype_ = DType::kF32;
  AlignedBytes data_;
};

// `x` rounded to `dtype` and widened back to fp32 (identity for f32): the value a weight
// packed at that dtype multiplies by. int8 rounds blocks, not elements (QuantizeInt8Block):
// here it is the identity, which is what the CPU backend keeps its vectors (biases, layer
// norms, positions) in at int8.
float RoundToDType(float x, DType dtype);

// K rows per scale of an int8 panel (see the top of this file).
inline constexpr int64_t kInt8BlockK = 32;

// q[i] = round-to-nearest-even(x[i] * (127 / m)) for i in [0, n), m = max |x[i]|, and returns
// the scale m / 127 (all 0 when m is 0): the rounding of a block of weights at pack time and of
// a row's block of activations in MatMul. 1 <= n <= kInt8BlockK.
float QuantizeInt8Block(const float* x, int64_t n, int8_t* q);

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
// avx512vl), else AVX2 with AVX-VNNI where it has that, else AVX2 (+ FMA + F16C, the baseline
// this library is built for); and kAmx over AVX-512 where the CPU has AMX tiles and the kernel
// grants them. kAvxVnni differs from kAvx2, and kAmx from kAvx512, for int8 panels only
// (vpdpbusd on 256 bits instead of vpmaddubsw; AMX's tdpbsud for each 16 rows instead of
// vpdpbusd). int8 panels take AVX-512's blocks only where the CPU also has avx512bw and
// avx512_vnni, else AVX-VNNI's or AVX2's. Every choice gives identical bits (the invariant
// above); the setting exists so that tests can run each path on one machine and benchmarks can
// compare them. The environment variable PREFIXD_CPU_ISA=avx2 (or avxvnni, avx512, amx) makes
// kAuto pick that one, for running a whole program (a server, a test suite) as it would run on
// a CPU with only that (avx2: an AMD Zen 2 or 3; avx512: a Xeon before Sapphire Rapids, or
// AMD Zen 4); a choice the CPU lacks falls back to the best it has, with one line on stderr.
enum class MatMulIsa { kAuto, kAvx2, kAvx512, kAvxVnni, kAmx };
bool MatMulIsaSupported(MatMulIsa isa);
// "auto", "avx2", "avxvnni", "avx512", "amx": PREFIXD_CPU_ISA's values and the benchmarks' --isa.
const char* MatMulIsaName(MatMulIsa isa);
std::optional<MatMulIsa> ParseMatMulIsa(std::string_view name);
// Process-wide. PREFIXD_CHECKs that `isa` is supported. Not to be called while a MatMul runs.
void SetMatMulIsa(MatMulIsa isa);
// What kAuto (or the setting) runs: "amx", "avx512", "avxvnni" or "avx2" (the names
// PREFIXD_CPU_ISA and the benchmarks' --isa take), with what int8 panels run when it differs,
// e.g. "avx512 (int8: avxvnni)". For the start-up log and benchmark tables.
std::string MatMulIsaInUse();
// For tests on CPUs without AMX but with AVX-512 VNNI: kAmx becomes supported, and its blocks
// run the tile instructions in scalar code (kernels/cpu/matmul_amx.cc). That proves the tiling,
// the operand layout and the fp32 order, not speed. Off by default; never on in the server.
void SetAmxEmulationForTesting(bool on);

// The obviously-right twin: scalar fmaf chain with K in order, from the unpacked [k, n] fp32
// matrix (for a half-precision PackedMatrix, pass w with each element RoundToDType'd).
void MatMulReference(const float* a, int64_t m, int64_t lda, const float* w, int64_t k, int64_t n,
                     const float* bias, float* c, int64_t ldc);

// The int8 twin, in scalar code: rows of `a` rounded by QuantizeInt8Block, `wq` the rounded
// weights [k, n] and `ws` their scales [ceil(k / kInt8BlockK), n], the integer block sums and
// the fp32 steps of the int8 invariant above.
void MatMulReferenceInt8(const float* a, int64_t m, int64_t lda, const int8_t* wq, const float* ws,
                         int64_t k, int64_t n, const float* bias, float* c, int64_t ldc);

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CPU_MATMUL_H_
