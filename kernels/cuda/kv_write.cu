#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_write.cuh"
#include "kernels/cuda/launch.cuh"

namespace prefixd::cuda {
namespace {

template <typename T>
__global__ void KvWriteKernel(float* __restrict__ qkv, const T* __restrict__ bias,
                              const int32_t* __restrict__ slots, T* __restrict__ pool,
                              KvPoolLayout layout, int32_t layer) {
  const int64_t t = blockIdx.x;
  const int32_t n_embd = layout.n_head * layout.head_dim;
  float* row = qkv + t * 3 * n_embd;
  const int32_t slot = slots[t];
  const int64_t block = slot / layout.block_size;
  const int32_t pos_in_block = slot % layout.block_size;
  for (int e = threadIdx.x; e < 3 * n_embd; e += blockDim.x) {
    const float v = row[e] + ToFloat(bias[e]);
    row[e] = v;
    if (e >= n_embd) {
      const int32_t kv = e / n_embd - 1;
      const int32_t head = (e % n_embd) / layout.head_dim;
      const int32_t d = e % layout.head_dim;
      pool[layout.HeadOffset(block, layer, kv, head) +
           static_cast<int64_t>(pos_in_block) * layout.head_dim + d] = FromFloat<T>(v);
    }
  }
}

}  // namespace

cudaError_t LaunchKvWrite(DType dtype, const KvWriteArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  constexpr int kThreads = 256;  // 3 * 768 / 256 = 9 coalesced passes per token for GPT-2
  PREFIXD_DISPATCH_DTYPE(dtype, Launch(KvWriteKernel<T>, a.num_tokens, kThreads, 0, stream, a.qkv,
                                       static_cast<const T*>(a.bias), a.slots,
                                       static_cast<T*>(a.kv_pool), a.layout, a.layer));
  return cudaGetLastError();
}

}  // namespace prefixd::cuda
