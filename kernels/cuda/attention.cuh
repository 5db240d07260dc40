// Causal self-attention over the paged KV pool, for prefill chunks and decode tokens alike:
// each new token attends to positions [0, its position] of its own sequence, reading K/V
// through the sequence's block table (the chunk's own K/V were written by LaunchKvWrite
// first). A prefill chunk starting at start_pos therefore gets the offset causal mask, and a
// decode token is a chunk of one. Slots past a token's position are never read.
#ifndef PREFIXD_KERNELS_CUDA_ATTENTION_CUH_
#define PREFIXD_KERNELS_CUDA_ATTENTION_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"
#include "kernels/cuda/kv_pool_layout.h"

namespace prefixd::cuda {

// Largest head_dim the kernel handles (its accumulators live in registers); GPT-2 uses 64.
inline constexpr int32_t kMaxAttentionHeadDim = 128;
// Most key splits per (token, head) (flash-decoding); see AttentionSplits.
inline constexpr int32_t kMaxAttentionSplits = 16;

// How many parts to split each (token, head)'s keys into, so that a small decode batch still
// fills the device: the smallest power of two giving at least 4 blocks per SM, but no more
// than kMaxAttentionSplits and no part under 64 keys (below that a block's fixed cost, the
// partial write and the merge, outweighs its share of keys). 1 for prefill-sized batches.
// A power of two so that CUDA graphs keyed by it stay few.
inline int32_t AttentionSplits(int64_t num_tokens, int32_t n_head, int32_t max_keys,
                               int32_t num_sms) {
  const int64_t blocks = num_tokens * n_head;
  const int64_t target = 4 * static_cast<int64_t>(num_sms);
  int32_t splits = 1;
  while (splits < kMaxAttentionSplits && blocks * splits < target &&
         static_cast<int64_t>(splits) * 2 * 64 <= max_keys) {
    splits *= 2;
  }
  return splits;
}

// Floats of partial results LaunchPagedAttention needs for `splits` > 1.
inline int64_t AttentionPartialFloats(int64_t num_tokens, int32_t n_head, int32_t head_dim,
                                      int32_t splits) {
  return splits > 1 ? num_tokens * n_head * splits * (head_dim + 2) : 0;
}

struct AttentionArgs {
  const float* qkv = nullptr;     // [num_tokens, 3 * n_embd] fp32; Q in [0, n_embd)
  const void* kv_pool = nullptr;  // KvPoolLayout, dtype
  KvPoolLayout layout;
  int32_t layer = 0;
  const int32_t* positions = nullptr;     // [num_tokens] absolute position of each token
  const int32_t* token_seq = nullptr;     // [num_tokens] row of block_tables for each token
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  int32_t num_tokens = 0;
  // Each token's keys [0, position] are cut into num_splits near-equal parts, one block
  // each; with more than one, the parts' (max, sum, weighted V) go to `partials` and a
  // second kernel merges them.
  int32_t num_splits = 1;
  float* partials = nullptr;  // [num_tokens, n_head, num_splits, head_dim + 2] if splits > 1
  void* out = nullptr;        // [num_tokens, n_embd] dtype, heads side by side
};

cudaError_t LaunchPagedAttention(DType dtype, const AttentionArgs& args, cudaStream_t stream);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_ATTENTION_CUH_
