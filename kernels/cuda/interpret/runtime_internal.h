// What runtime.cc shares with cublas.cc: device allocations, streams and errors.
#ifndef PREFIXD_KERNELS_CUDA_INTERPRET_RUNTIME_INTERNAL_H_
#define PREFIXD_KERNELS_CUDA_INTERPRET_RUNTIME_INTERNAL_H_

#include <cstddef>
#include <functional>
#include <string>

#include "kernels/cuda/interpret/runtime_api.h"

namespace prefixd::cuda_interpret {

// Work on a stream: runs at once, or is recorded while the stream is being captured.
// Returns the error of the call itself (cudaErrorStreamCaptureInvalidated when recording
// into an invalidated capture); a failure while the work runs is made sticky by the work.
using StreamWork = std::function<void()>;
cudaError_t Enqueue(cudaStream_t stream, StreamWork work);

// Whether [ptr, ptr + bytes) lies inside one device allocation.
bool InDeviceAllocation(const void* ptr, size_t bytes);

// Sets the calling thread's last error to `error` (not sticky) and returns it.
cudaError_t SetError(cudaError_t error);
// A failure found while work ran on the device: sticky from now on, and logged once.
void FailSticky(cudaError_t error, const std::string& message);
// The sticky error, or cudaSuccess.
cudaError_t StickyError();
// True (and sets the last error) when the driver is simulated missing.
bool DriverMissing();

void CountGemm();

}  // namespace prefixd::cuda_interpret

#endif  // PREFIXD_KERNELS_CUDA_INTERPRET_RUNTIME_INTERNAL_H_
