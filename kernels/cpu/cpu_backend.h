// The CPU backend: GPT-2's forward pass over paged K/V in fp32 arithmetic, bit-exact under
// caching, chunked prefill, batch composition, thread count and instruction set (see
// matmul.h and ops.h for how).
//
// The backend copies the model's weights at construction (packing the matrices into column
// panels), so the Model may be released afterwards. `dtype` is the weights' storage: f32, or
// f16 / bf16, where every weight (matrices, embeddings, biases, layer norms) is rounded to
// nearest even at load and the matrices stream at half the bytes; activations, accumulation
// and the KV cache stay fp32 either way. A half-precision backend is therefore exactly the
// f32 backend run on the rounded checkpoint, with the same invariance. int8 rounds the
// matrices (and the tied embeddings, which are the LM head) to 8-bit integers with an fp32
// scale per 32 K rows, and the products round their input rows the same way and multiply
// bytes (matmul.h); vectors (biases, layer norms, positions) stay fp32. It keeps the same
// invariance with its own arithmetic. KV storage for
// KvBlocksForBudget(kv_pool.budget_bytes, kv_pool.block_size, KvBytesPerToken(L, H, hd, 4))
// blocks is allocated once and never grown; block b is [n_layer][2][n_head][block_size]
// [head_dim] floats, what ReadKvBlock/WriteKvBlock move (tests plant and inspect the pool that
// way: tests/kernels/kv_pool_access.h).
#ifndef PREFIXD_KERNELS_CPU_CPU_BACKEND_H_
#define PREFIXD_KERNELS_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "cache/kv_pool.h"
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"

namespace prefixd {

// Backend::kv_numerics() of every CPU backend. The revision moves with any kernel change that
// changes a K/V bit, so that a disk tier written by the old arithmetic is not read by the new.
inline constexpr std::string_view kCpuKvNumerics = "cpu r1";

// More threads than any machine has cores would only cost memory (each has a stack) and
// start-up time; far more fail to start at all.
inline constexpr int32_t kMaxCpuBackendThreads = 1024;

struct CpuBackendOptions {
  const Model* model = nullptr;  // read during CreateCpuBackend only
  DType dtype = DType::kF32;     // of the weights (see above)
  // --kv-cache-bytes and --block-size. The budget must hold at least one block: 0 holds none
  // here (the server's factory turns 0 into DefaultCpuKvBudget first).
  KvPoolOptions kv_pool;
  int32_t threads = 0;  // --threads: 0 = std::thread::hardware_concurrency()
};

// INVALID_ARGUMENT when the model is null, the KV pool's options are bad
// (ValidateKvPoolOptions), the thread count is outside 0 to kMaxCpuBackendThreads, or the
// budget holds zero blocks; the flags' errors name the flag.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options);

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CPU_CPU_BACKEND_H_
