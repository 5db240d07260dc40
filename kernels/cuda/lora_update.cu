#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/lora_update.cuh"

namespace prefixd::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    LoraUpdateKernel(const LoraRowDevice* __restrict__ rows, int32_t module,
                     const T* __restrict__ x, int64_t ld_x, int32_t in, float* __restrict__ y,
                     int64_t ld_y, int32_t out) {
  __shared__ float t[kLoraUpdateMaxRank];
  const int64_t row = blockIdx.x;
  const LoraRowDevice entry = rows[row];
  // The whole block leaves together (before any barrier) for a row without an update.
  if (entry.modules == nullptr) return;
  const LoraModuleDevice m = entry.modules[module];
  if (m.a == nullptr) return;
  const T* __restrict__ a = static_cast<const T*>(m.a);  // [rank, in]
  const T* __restrict__ b = static_cast<const T*>(m.b);  // [rank, out]
  const T* __restrict__ xr = x + row * ld_x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int32_t j = warp; j < entry.rank; j += kWarps) {
    const T* __restrict__ aj = a + static_cast<int64_t>(j) * in;
    float acc = 0.0f;
    for (int32_t k = lane; k < in; k += 32) acc = fmaf(ToFloat(xr[k]), ToFloat(aj[k]), acc);
    acc = WarpSum(acc);
    if (lane == 0) t[j] = acc * entry.scaling;
  }
  __syncthreads();
  float* __restrict__ yr = y + row * ld_y;
  for (int32_t o = threadIdx.x; o < out; o += kThreads) {
    float acc = 0.0f;
    for (int32_t j = 0; j < entry.rank; ++j) {
      acc = fmaf(t[j], ToFloat(b[static_cast<int64_t>(j) * out + o]), acc);
    }
    yr[o] += acc;
  }
}

}  // namespace

cudaError_t LaunchLoraUpdate(DType dtype, const LoraUpdateArgs& args, cudaStream_t stream) {
  if (args.num_rows == 0) return cudaSuccess;
  PREFIXD_DISPATCH_DTYPE(dtype, Launch(LoraUpdateKernel<T>, args.num_rows, kThreads, 0, stream,
                                       args.rows, args.module, static_cast<const T*>(args.x),
                                       args.ld_x, args.in, args.y, args.ld_y, args.out));
  return cudaGetLastError();
}

}  // namespace prefixd::cuda
