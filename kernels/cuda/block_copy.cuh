// Copy-on-write inside the KV pool: for each copy, rows [0, num_rows) of every layer's and
// head's K and V from block src to block dst, all copies in one launch.
#ifndef PREFIXD_KERNELS_CUDA_BLOCK_COPY_CUH_
#define PREFIXD_KERNELS_CUDA_BLOCK_COPY_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"
#include "kernels/cuda/kv_pool_layout.h"

namespace prefixd::cuda {

// The caller has validated src != dst, both in range, 0 <= num_rows <= block_size.
// Copies are applied as if in order only when no dst is another copy's src (cache/ never
// asks otherwise: a copy's destination is a freshly allocated block).
cudaError_t LaunchBlockCopy(DType dtype,
                            const int32_t* copies,  // [num_copies, 3] (src, dst, num_rows)
                            int32_t num_copies, const KvPoolLayout& layout,
                            void* kv_pool,  // KvPoolLayout, dtype
                            cudaStream_t stream);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_BLOCK_COPY_CUH_
