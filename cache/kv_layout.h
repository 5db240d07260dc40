// The KV byte formula, written once: cache/ sizes the pool with it, backends allocate with
// it, metrics and GetModelInfo report it.
#ifndef PREFIXD_CACHE_KV_LAYOUT_H_
#define PREFIXD_CACHE_KV_LAYOUT_H_

#include <cstdint>

namespace prefixd {

// Bytes of K and V for one token: 2 (K and V) x layers x heads x head_dim x element size.
// GPT-2 small in fp16: 2 x 12 x 12 x 64 x 2 = 36,864 B.
constexpr int64_t KvBytesPerToken(int64_t n_layer, int64_t n_head, int64_t head_dim,
                                  int64_t element_bytes) {
  return 2 * n_layer * n_head * head_dim * element_bytes;
}

// Number of whole blocks a byte budget holds. Never grows after start-up.
constexpr int64_t KvBlocksForBudget(int64_t budget_bytes, int64_t block_size,
                                    int64_t bytes_per_token) {
  return budget_bytes / (block_size * bytes_per_token);
}

}  // namespace prefixd

#endif  // PREFIXD_CACHE_KV_LAYOUT_H_
