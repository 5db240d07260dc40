// Runs a kernel's grid on the calling OS thread: blocks one after another, the threads of a
// block as fibers (Boost.Context) that switch only at __syncthreads and warp shuffles.
//
// Invariants while a block runs: a thread is runnable, waiting at the block barrier, waiting
// at its warp's exchange, or done; the block barrier releases when every thread of the block
// has arrived, a warp exchange when all 32 lanes have. A launch fails (and the rest of the
// block is unwound) when a thread exits while others wait at a barrier it can no longer
// reach, when a barrier completes with some threads exited, when a shuffle's mask names
// lanes that do not exist or have exited, or when no thread can run and some are not done.
#ifndef PREFIXD_KERNELS_CUDA_INTERPRET_SCHEDULER_H_
#define PREFIXD_KERNELS_CUDA_INTERPRET_SCHEDULER_H_

#include <functional>
#include <string>

#include "kernels/cuda/interpret/device_api.h"

namespace prefixd::cuda_interpret {

// Runs `body` once per thread of every block of `grid` x `block` (both already checked).
// Empty on success; otherwise what went wrong, naming the block and thread.
std::string RunGrid(dim3 grid, dim3 block, const std::function<void()>& body);

}  // namespace prefixd::cuda_interpret

#endif  // PREFIXD_KERNELS_CUDA_INTERPRET_SCHEDULER_H_
