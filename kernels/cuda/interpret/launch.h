// Kernel launches in the interpreter: what `kernel<<<grid, block, smem, stream>>>(args...)`
// does on a GPU. The arguments are converted to the kernel's parameter types and copied at
// the launch, as CUDA copies them into the launch's parameter buffer; the launch is checked
// as a GPU checks it (kernels/cuda/interpret/runtime.cc) and then runs every thread of
// every block on the stream, or is recorded into the graph the stream is capturing.
#ifndef PREFIXD_KERNELS_CUDA_INTERPRET_LAUNCH_H_
#define PREFIXD_KERNELS_CUDA_INTERPRET_LAUNCH_H_

#include <cstddef>
#include <functional>
#include <tuple>
#include <utility>

#include "kernels/cuda/interpret/device_api.h"
#include "kernels/cuda/interpret/runtime_api.h"

namespace prefixd::cuda_interpret {

// Checks the configuration (sets the thread's last error when a GPU would refuse it), then
// runs or records `body`, which runs one thread of the kernel at the coordinates the
// scheduler has set.
void LaunchKernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                  std::function<void()> body);

template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "wrong number of kernel arguments");
  LaunchKernel(grid, block, shared_bytes, stream,
               [kernel, params = std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)] {
                 std::apply(kernel, params);
               });
}

}  // namespace prefixd::cuda_interpret

#endif  // PREFIXD_KERNELS_CUDA_INTERPRET_LAUNCH_H_
