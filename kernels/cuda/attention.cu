#include <math.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace prefixd::cuda {
namespace {

// Four warps per (token, head, split): each warp walks every fourth key of the split with its
// own online softmax, then the four partial results are merged in shared memory. One key per
// warp step keeps each key row's load coalesced across the lanes; four warps give enough
// loads in flight per block without a second reduction level.
constexpr int kWarps = 4;
constexpr int kDimsPerLane = kMaxAttentionHeadDim / 32;

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    PagedAttentionKernel(const float* __restrict__ qkv, const T* __restrict__ pool,
                         KvPoolLayout layout, int32_t layer, const int32_t* __restrict__ positions,
                         const int32_t* __restrict__ token_seq,
                         const int32_t* __restrict__ block_tables, int32_t max_blocks_per_seq,
                         float* __restrict__ partials, T* __restrict__ out) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxAttentionHeadDim];

  const int64_t t = blockIdx.x;
  const int32_t head = blockIdx.y;
  const int32_t split = blockIdx.z;
  const int32_t num_splits = gridDim.z;
  const int32_t hd = layout.head_dim;
  const int32_t n_embd = layout.n_head * hd;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int32_t pos = positions[t];
  // This split's keys: [key_begin, key_end) of [0, pos], in near-equal parts.
  const int32_t per_split = (pos + num_splits) / num_splits;  // ceil((pos + 1) / splits)
  const int32_t key_begin = min(split * per_split, pos + 1);
  const int32_t key_end = min(key_begin + per_split, pos + 1);
  const int32_t* table = block_tables + static_cast<int64_t>(token_seq[t]) * max_blocks_per_seq;
  // 1/sqrt(head_dim), as GPT-2's scale_attn_weights; folded into q once.
  const float scale = rsqrtf(static_cast<float>(hd));

  float q[kDimsPerLane];
  float acc[kDimsPerLane];
  const float* qrow = qkv + t * 3 * n_embd + static_cast<int64_t>(head) * hd;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < hd ? qrow[d] * scale : 0.0f;
    acc[i] = 0.0f;
  }

  float m = -INFINITY;  // running max of this warp's scores
  float l = 0.0f;       // running sum of exp(score - m)
  for (int32_t j = key_begin + warp; j < key_end; j += kWarps) {
    const int64_t block = table[j / layout.block_size];
    const int64_t row_off = static_cast<int64_t>(j % layout.block_size) * hd;
    const T* k = pool + layout.HeadOffset(block, layer, 0, head) + row_off;
    const T* v = pool + layout.HeadOffset(block, layer, 1, head) + row_off;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) dot += q[i] * ToFloat(k[d]);
    }
    const float s = WarpSum(dot);
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * correction + (d < hd ? p * ToFloat(v[d]) : 0.0f);
    }
    m = m_new;
  }

  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();

  // Merge the warps: one that saw no key has m = -inf, so its weight exp(m - m_all) is
  // exactly 0 and its zero accumulators add nothing.
  float m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, warp_max[w]);
  float weight[kWarps];
  float l_all = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    // A split with no keys at all (pos + 1 < num_splits) has m_all = -inf: weights 0, not NaN.
    weight[w] = m_all == -INFINITY ? 0.0f : expf(warp_max[w] - m_all);
    l_all += warp_sum[w] * weight[w];
  }
  if (num_splits == 1) {
    // Key 0 is always in the only split, so l_all >= 1.
    const float inv_l = 1.0f / l_all;
    T* o = out + t * n_embd + static_cast<int64_t>(head) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += warp_acc[w][d] * weight[w];
      o[d] = FromFloat<T>(v * inv_l);
    }
    return;
  }
  // Partial: (max, sum, unnormalised weighted V) of this split.
  float* part = partials + ((t * layout.n_head + head) * num_splits + split) * (hd + 2);
  if (threadIdx.x == 0) {
    part[0] = m_all;
    part[1] = l_all;
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += warp_acc[w][d] * weight[w];
    part[2 + d] = v;
  }
}

template <typename T>
__global__ void MergeSplitsKernel(const float* __restrict__ partials, int32_t n_head,
                                  int32_t head_dim, int32_t num_splits, T* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const int32_t head = blockIdx.y;
  const float* part = partials + (t * n_head + head) * num_splits * (head_dim + 2);
  float m_all = -INFINITY;
  for (int s = 0; s < num_splits; ++s) m_all = fmaxf(m_all, part[s * (head_dim + 2)]);
  // Split 0 holds key 0, so m_all is finite; empty splits (m = -inf) weigh exactly 0.
  float l_all = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    const float* p = part + s * (head_dim + 2);
    l_all += p[1] * expf(p[0] - m_all);
  }
  const float inv_l = 1.0f / l_all;
  T* o = out + t * n_head * head_dim + static_cast<int64_t>(head) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      const float* p = part + s * (head_dim + 2);
      v += p[2 + d] * expf(p[0] - m_all);
    }
    o[d] = FromFloat<T>(v * inv_l);
  }
}

}  // namespace

cudaError_t LaunchPagedAttention(DType dtype, const AttentionArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  if (a.layout.head_dim > kMaxAttentionHeadDim || a.num_splits < 1 ||
      a.num_splits > kMaxAttentionSplits || (a.num_splits > 1 && a.partials == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(a.num_tokens, a.layout.n_head, a.num_splits);
  PREFIXD_DISPATCH_DTYPE(
      dtype, Launch(PagedAttentionKernel<T>, grid, kWarps * 32, 0, stream, a.qkv,
                    static_cast<const T*>(a.kv_pool), a.layout, a.layer, a.positions, a.token_seq,
                    a.block_tables, a.max_blocks_per_seq, a.partials, static_cast<T*>(a.out)));
  if (a.num_splits == 1) return cudaGetLastError();
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // One warp per (token, head) suffices to merge: head_dim <= 128 values, <= 16 splits.
  const int threads = 32;
  PREFIXD_DISPATCH_DTYPE(dtype, Launch(MergeSplitsKernel<T>, dim3(a.num_tokens, a.layout.n_head),
                                       threads, 0, stream, a.partials, a.layout.n_head,
                                       a.layout.head_dim, a.num_splits, static_cast<T*>(a.out)));
  return cudaGetLastError();
}

}  // namespace prefixd::cuda
