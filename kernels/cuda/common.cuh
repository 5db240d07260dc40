// Device-side helpers shared by the kernels: element loads/stores through fp32 and the
// dtype dispatch the host launchers use. Included only by .cu files.
//
// Every kernel reads and writes weights, activations and KV in the storage type T (float,
// __half or __nv_bfloat16) and does its arithmetic in fp32: the fp32 accumulation is what
// keeps f16/bf16 within a few ulps of the fp32 reference.
#ifndef PREFIXD_KERNELS_CUDA_COMMON_CUH_
#define PREFIXD_KERNELS_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "engine/dtype.h"

namespace prefixd::cuda {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
// Round to nearest even, like the host's FloatToHalf/FloatToBF16, so the CPU twins in the
// tests can reproduce the stored values exactly.
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over a block whose size is a multiple of 32 (<= 1024). All threads get the result.
// `scratch` holds 32 floats of shared memory; the function syncs before reusing it.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}

}  // namespace prefixd::cuda

// Runs `body` with `T` bound to the storage type of `dtype`. Each kernel is instantiated for
// the three types only (compile time is CI time).
#define PREFIXD_DISPATCH_DTYPE(dtype, ...) \
  do {                                     \
    switch (dtype) {                       \
      case ::prefixd::DType::kF32: {       \
        using T = float;                   \
        __VA_ARGS__;                       \
        break;                             \
      }                                    \
      case ::prefixd::DType::kF16: {       \
        using T = __half;                  \
        __VA_ARGS__;                       \
        break;                             \
      }                                    \
      case ::prefixd::DType::kBF16: {      \
        using T = __nv_bfloat16;           \
        __VA_ARGS__;                       \
        break;                             \
      }                                    \
      case ::prefixd::DType::kI8:          \
        break; /* CPU only: refused */     \
    }                                      \
  } while (0)

#endif  // PREFIXD_KERNELS_CUDA_COMMON_CUH_
