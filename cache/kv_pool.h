// The KV pool in two structs: what the operator asks for (KvPoolOptions: the --kv-cache-bytes
// and --block-size flags), read only by the backend that allocates the pool, and what that
// backend built (KvPoolShape, Backend::kv_pool()), which everything after it reads: the
// KvCache, request validation, the disk tier's layout, GetModelInfo. Nobody else declares a
// block size.
#ifndef PREFIXD_CACHE_KV_POOL_H_
#define PREFIXD_CACHE_KV_POOL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace prefixd {

inline constexpr int32_t kMaxKvBlockSize = 1024;

struct KvPoolOptions {
  // --kv-cache-bytes: the pool's byte budget. 0: the backend's default (the server's
  // DefaultCpuKvBudget on the CPU, a fraction of free memory on CUDA).
  int64_t budget_bytes = 0;
  // --block-size: tokens per block, a power of two from 1 to kMaxKvBlockSize.
  int32_t block_size = 16;
};

// The one check of KvPoolOptions, made by the backend that reads them (CreateCpuBackend,
// CreateCudaBackend): INVALID_ARGUMENT naming the flag and the value given.
absl::Status ValidateKvPoolOptions(const KvPoolOptions& options);

// The pool as allocated, fixed for the backend's lifetime.
struct KvPoolShape {
  int64_t num_blocks = 0;
  int32_t block_size = 0;       // tokens per block
  int64_t bytes_per_token = 0;  // KvBytesPerToken() of the stored element (cache/kv_layout.h)

  int64_t pool_bytes() const { return num_blocks * block_size * bytes_per_token; }
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_KV_POOL_H_
