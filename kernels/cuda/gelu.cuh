// The MLP's middle: u = gelu_new(fc + bias), from the fp32 c_fc product into the dtype that
// c_proj's GEMM reads.
#ifndef PREFIXD_KERNELS_CUDA_GELU_CUH_
#define PREFIXD_KERNELS_CUDA_GELU_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"

namespace prefixd::cuda {

// gelu_new(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as HF's NewGELUActivation.
cudaError_t LaunchBiasGelu(DType dtype,
                           const float* fc,   // [num_rows, width] fp32
                           const void* bias,  // [width] dtype
                           int32_t num_rows, int32_t width,
                           void* out,  // [num_rows, width] dtype
                           cudaStream_t stream);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_GELU_CUH_
