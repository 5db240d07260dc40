// Token + position embedding into the fp32 residual stream.
#ifndef PREFIXD_KERNELS_CUDA_EMBEDDING_CUH_
#define PREFIXD_KERNELS_CUDA_EMBEDDING_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"

namespace prefixd::cuda {

// x[t, :] = wte[token_ids[t], :] + wpe[positions[t], :] for t < num_tokens, summed in fp32.
// The caller has validated token_ids < vocab and positions < n_positions.
cudaError_t LaunchEmbedding(DType dtype,
                            const void* wte,           // [vocab, n_embd] dtype
                            const void* wpe,           // [n_positions, n_embd] dtype
                            const int32_t* token_ids,  // [num_tokens]
                            const int32_t* positions,  // [num_tokens]
                            int32_t num_tokens, int32_t n_embd,
                            float* x,  // [num_tokens, n_embd] out
                            cudaStream_t stream);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_EMBEDDING_CUH_
