#include "kernels/cuda/block_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace prefixd::cuda {
namespace {

// U is an unsigned integer of the element's size: a copy moves bits, never converts.
template <typename U>
__global__ void BlockCopyKernel(const int32_t* __restrict__ copies, KvPoolLayout layout,
                                U* __restrict__ pool) {
  const int32_t* c = copies + 3 * blockIdx.x;
  const int32_t src = c[0], dst = c[1], num_rows = c[2];
  // blockIdx.y enumerates (layer, kv, head).
  const int32_t head = blockIdx.y % layout.n_head;
  const int32_t kv = (blockIdx.y / layout.n_head) % 2;
  const int32_t layer = blockIdx.y / (2 * layout.n_head);
  const U* from = pool + layout.HeadOffset(src, layer, kv, head);
  U* to = pool + layout.HeadOffset(dst, layer, kv, head);
  const int32_t n = num_rows * layout.head_dim;  // the rows of one head are contiguous
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
}

}  // namespace

cudaError_t LaunchBlockCopy(DType dtype, const int32_t* copies, int32_t num_copies,
                            const KvPoolLayout& layout, void* kv_pool, cudaStream_t stream) {
  if (num_copies == 0) return cudaSuccess;
  const dim3 grid(num_copies, layout.n_layer * 2 * layout.n_head);
  constexpr int kThreads = 128;  // a head's block is 16 x 64 elements: 8 passes
  if (DTypeSize(dtype) == 4) {
    Launch(BlockCopyKernel<uint32_t>, grid, kThreads, 0, stream, copies, layout,
           static_cast<uint32_t*>(kv_pool));
  } else {
    Launch(BlockCopyKernel<uint16_t>, grid, kThreads, 0, stream, copies, layout,
           static_cast<uint16_t*>(kv_pool));
  }
  return cudaGetLastError();
}

}  // namespace prefixd::cuda
