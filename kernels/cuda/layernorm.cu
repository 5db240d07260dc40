#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/layernorm.cuh"

namespace prefixd::cuda {
namespace {

template <typename T>
__global__ void LayerNormKernel(float* __restrict__ x, const int32_t* __restrict__ row_index,
                                const T* __restrict__ residual_bias, const T* __restrict__ gamma,
                                const T* __restrict__ beta, T* __restrict__ out, int32_t n_embd,
                                float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t i = row_index != nullptr ? row_index[r] : r;
  float* row = x + i * n_embd;
  // Each thread touches only its own elements (e = threadIdx.x + k * blockDim.x) in every
  // pass, so the in-place bias add needs no barrier before the reads below.
  float sum = 0.0f;
  for (int e = threadIdx.x; e < n_embd; e += blockDim.x) {
    float v = row[e];
    if (residual_bias != nullptr) {
      v += ToFloat(residual_bias[e]);
      row[e] = v;
    }
    sum += v;
  }
  const float mean = BlockSum(sum, scratch) / n_embd;
  // Two passes (mean, then squared deviations) rather than E[x^2] - mean^2: the residual
  // stream of GPT-2 has rows with |mean| >> std where the one-pass form cancels badly.
  float sq = 0.0f;
  for (int e = threadIdx.x; e < n_embd; e += blockDim.x) {
    const float d = row[e] - mean;
    sq += d * d;
  }
  const float var = BlockSum(sq, scratch) / n_embd;
  const float inv_std = rsqrtf(var + eps);
  T* o = out + r * n_embd;
  for (int e = threadIdx.x; e < n_embd; e += blockDim.x) {
    o[e] = FromFloat<T>((row[e] - mean) * inv_std * ToFloat(gamma[e]) + ToFloat(beta[e]));
  }
}

}  // namespace

cudaError_t LaunchLayerNorm(DType dtype, const LayerNormArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0) return cudaSuccess;
  // One block per row: a row (768..1600 floats) is too small to split across blocks, and
  // 256 threads keep the two block reductions short.
  constexpr int kThreads = 256;
  PREFIXD_DISPATCH_DTYPE(
      dtype, Launch(LayerNormKernel<T>, a.num_rows, kThreads, 0, stream, a.x, a.row_index,
                    static_cast<const T*>(a.residual_bias), static_cast<const T*>(a.gamma),
                    static_cast<const T*>(a.beta), static_cast<T*>(a.out), a.n_embd, a.eps));
  return cudaGetLastError();
}

}  // namespace prefixd::cuda
