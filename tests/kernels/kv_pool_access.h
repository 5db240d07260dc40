// The whole K/V pool of a CPU backend as floats, for tests that plant or inspect K/V
// (copy-on-write patterns, rows a step may not read, wrong-reuse demonstrations). Built on
// the Backend's own block reads and writes (engine/backend.h): the CPU backend keeps fp32 K/V
// with block b at [b][n_layer][2 (K, V)][n_head][block_size][head_dim], so the pool is its
// blocks in order and the product needs no test accessor.
#ifndef PREFIXD_TESTS_KERNELS_KV_POOL_ACCESS_H_
#define PREFIXD_TESTS_KERNELS_KV_POOL_ACCESS_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "base/check.h"
#include "engine/backend.h"

namespace prefixd {

// [num_blocks][n_layer][2][n_head][block_size][head_dim] floats.
inline std::vector<float> ReadKvPool(Backend& backend) {
  PREFIXD_CHECK(backend.KvBlockBytes() % sizeof(float) == 0);
  const int64_t block_floats = backend.KvBlockBytes() / static_cast<int64_t>(sizeof(float));
  std::vector<float> pool(static_cast<size_t>(backend.num_blocks() * block_floats));
  std::vector<uint8_t> bytes(static_cast<size_t>(backend.KvBlockBytes()));
  for (int64_t b = 0; b < backend.num_blocks(); ++b) {
    PREFIXD_CHECK(backend.ReadKvBlock(static_cast<int32_t>(b), absl::MakeSpan(bytes)).ok());
    std::memcpy(pool.data() + b * block_floats, bytes.data(), bytes.size());
  }
  return pool;
}

// Replaces the whole pool; `pool` is laid out as ReadKvPool returns it.
inline void WriteKvPool(Backend& backend, absl::Span<const float> pool) {
  const int64_t block_floats = backend.KvBlockBytes() / static_cast<int64_t>(sizeof(float));
  PREFIXD_CHECK(static_cast<int64_t>(pool.size()) == backend.num_blocks() * block_floats);
  std::vector<uint8_t> bytes(static_cast<size_t>(backend.KvBlockBytes()));
  for (int64_t b = 0; b < backend.num_blocks(); ++b) {
    std::memcpy(bytes.data(), pool.data() + b * block_floats, bytes.size());
    PREFIXD_CHECK(backend.WriteKvBlock(static_cast<int32_t>(b), bytes).ok());
  }
}

}  // namespace prefixd

#endif  // PREFIXD_TESTS_KERNELS_KV_POOL_ACCESS_H_
