// LayerNorm of fp32 residual rows into the GEMM input type, with two fusions:
// the pending bias of the previous projection is first added to the residual row in place
// (the projection's GEMM already added its product onto the residual with beta = 1, so this
// completes "residual + bias"), and rows may be gathered (the final LayerNorm only needs the
// rows whose logits are wanted).
#ifndef PREFIXD_KERNELS_CUDA_LAYERNORM_CUH_
#define PREFIXD_KERNELS_CUDA_LAYERNORM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"

namespace prefixd::cuda {

struct LayerNormArgs {
  float* x = nullptr;                   // [*, n_embd] fp32 residual; rows read are updated
  const int32_t* row_index = nullptr;   // [num_rows] rows of x to normalise; null: 0..num_rows
  const void* residual_bias = nullptr;  // [n_embd] dtype, added to x first; may be null
  const void* gamma = nullptr;          // [n_embd] dtype
  const void* beta = nullptr;           // [n_embd] dtype
  void* out = nullptr;                  // [num_rows, n_embd] dtype
  int32_t num_rows = 0;
  int32_t n_embd = 0;
  float eps = 1e-5f;
};

// out[r] = (x'[i] - mean) / sqrt(var + eps) * gamma + beta, where i = row_index[r] and
// x'[i] = x[i] + residual_bias (stored back into x). Biased variance, as torch's LayerNorm.
cudaError_t LaunchLayerNorm(DType dtype, const LayerNormArgs& args, cudaStream_t stream);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_LAYERNORM_CUH_
