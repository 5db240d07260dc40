// How many KV blocks the CUDA backend allocates, decided before anything is allocated.
//
// The pool is num_blocks + 1 blocks: the extra one is the scratch block that padded rows of a
// CUDA-graph batch write (kernels/cuda/kv_pool_layout.h). It comes out of the budget, so
// pool_bytes = (num_blocks + 1) x block_bytes <= the budget. The budget is at most what is
// free on the device less kDeviceHeadroomBytes: cuBLAS, lazily loaded kernels and CUDA graph
// instantiation allocate after the pool, and a pool that took everything would make them fail
// mid-serving instead of at start-up. Pure host arithmetic: tested without a device.
#ifndef PREFIXD_KERNELS_CUDA_KV_BUDGET_H_
#define PREFIXD_KERNELS_CUDA_KV_BUDGET_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace prefixd::cuda {

// Device memory left unallocated after the pool. Why 256 MiB: lazily loaded cuBLAS and
// kernel modules take tens of MiB on first use, and each instantiated decode graph (up to
// nine batch buckets, a few attention split counts each) a few MiB; this covers them with
// a margin and is under 0.2% of an 80 GiB or larger device.
inline constexpr int64_t kDeviceHeadroomBytes = int64_t{256} << 20;

struct KvPoolRequest {
  int64_t budget_bytes = 0;  // explicit budget for the whole pool; 0: fraction x free
  double fraction = 0.8;     // of free_bytes, when budget_bytes is 0
  int64_t free_bytes = 0;    // device memory free once weights and buffers are allocated
  int64_t block_bytes = 0;   // one block: all layers, K and V, block_size rows
  int32_t block_size = 16;   // rows per block (slots block * block_size + row are int32)
};

struct KvPoolPlan {
  int64_t num_blocks = 0;    // blocks cache/ may hand out
  int64_t pool_bytes = 0;    // (num_blocks + 1) x block_bytes: what is allocated
  int64_t budget_bytes = 0;  // the budget the plan was cut from (the fraction resolved)
};

// RESOURCE_EXHAUSTED, saying what would fit, when an explicit budget is more than free memory
// less the headroom or when the budget holds no block beside the scratch block.
absl::StatusOr<KvPoolPlan> PlanKvPool(const KvPoolRequest& request);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_KV_BUDGET_H_
