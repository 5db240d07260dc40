// Finishes the QKV projection and stores the new tokens' K/V: adds the c_attn bias to the
// fp32 QKV rows in place (attention then reads Q from there) and scatters K and V, rounded
// to the pool's dtype, into each token's slot of the paged pool.
#ifndef PREFIXD_KERNELS_CUDA_KV_WRITE_CUH_
#define PREFIXD_KERNELS_CUDA_KV_WRITE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"
#include "kernels/cuda/kv_pool_layout.h"

namespace prefixd::cuda {

struct KvWriteArgs {
  float* qkv = nullptr;            // [num_tokens, 3 * n_embd] fp32, (Q | K | V), heads inside
  const void* bias = nullptr;      // [3 * n_embd] dtype
  const int32_t* slots = nullptr;  // [num_tokens] block_id * block_size + row of each token
  void* kv_pool = nullptr;         // KvPoolLayout, dtype
  KvPoolLayout layout;
  int32_t layer = 0;
  int32_t num_tokens = 0;
};

cudaError_t LaunchKvWrite(DType dtype, const KvWriteArgs& args, cudaStream_t stream);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_KV_WRITE_CUH_
