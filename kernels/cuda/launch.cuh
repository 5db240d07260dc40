// The one way kernels/cuda launches a kernel: `kernel<<<grid, block, shared_bytes, stream>>>`
// under nvcc, the interpreter's launch (kernels/cuda/interpret/launch.h) in an interpret
// build. Launchers check the launch as before, with cudaGetLastError().
#ifndef PREFIXD_KERNELS_CUDA_LAUNCH_CUH_
#define PREFIXD_KERNELS_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace prefixd::cuda {

template <typename... Params, typename... Args>
inline void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
#ifdef PREFIXD_CUDA_INTERPRET
  ::prefixd::cuda_interpret::Launch(kernel, grid, block, shared_bytes, stream,
                                    std::forward<Args>(args)...);
#else
  // clang-format off
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  // clang-format on
#endif
}

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_LAUNCH_CUH_
