// Where a K or V element lives in the CUDA backend's KV pool.
//
// The pool is one cudaMalloc, never grown:
//   [num_blocks + 1, n_layer, 2 (K, V), n_head, block_size, head_dim]  elements of the dtype
// Block-major so that a block (what cache/ hands out and copies) is one contiguous range;
// within a block, one head's rows are contiguous so attention reads a head's keys as
// consecutive head_dim vectors. The extra last block is scratch: padded rows of a CUDA-graph
// batch write their K/V there, never into a block cache/ owns.
#ifndef PREFIXD_KERNELS_CUDA_KV_POOL_LAYOUT_H_
#define PREFIXD_KERNELS_CUDA_KV_POOL_LAYOUT_H_

#include <cstdint>

#ifdef __CUDACC__
#define PREFIXD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PREFIXD_HOST_DEVICE inline
#endif

namespace prefixd::cuda {

struct KvPoolLayout {
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t block_size = 0;
  int32_t head_dim = 0;

  PREFIXD_HOST_DEVICE int64_t block_elems() const {
    return static_cast<int64_t>(n_layer) * 2 * n_head * block_size * head_dim;
  }
  // Offset (in elements) of row 0, element 0 of (block, layer, kv, head); kv 0 = K, 1 = V.
  PREFIXD_HOST_DEVICE int64_t HeadOffset(int64_t block, int32_t layer, int32_t kv,
                                         int32_t head) const {
    return (((block * n_layer + layer) * 2 + kv) * n_head + head) *
           static_cast<int64_t>(block_size) * head_dim;
  }
};

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_KV_POOL_LAYOUT_H_
