// Turning CUDA and cuBLAS error codes into absl::Status at the call site, and the decisions
// that depend only on an error code (host code: tested without a device).
//
// PREFIXD_CUDA_RETURN_IF_ERROR(stmt) / PREFIXD_CUBLAS_RETURN_IF_ERROR(stmt) evaluate `stmt`
// once and, if it failed, return from the enclosing function (which returns absl::Status)
// an INTERNAL status naming the statement, file, line and CUDA's error name and text,
// carrying the kFatalDeviceErrorPayload. Kernel launchers return cudaGetLastError(), so a
// launch is checked the same way. Never exits the process.
//
// CUDA keeps a failed call's error as the thread's "last error" until cudaGetLastError()
// reads it, so an error that is handled (out of memory at start-up, a graph that could not
// be captured) must be cleared where it is handled: otherwise the next launch's check
// reports it as that launch's failure. Sticky errors (IsStickyCudaError) cannot be cleared:
// every later call returns them.
#ifndef PREFIXD_KERNELS_CUDA_CUDA_CHECK_H_
#define PREFIXD_KERNELS_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"

namespace prefixd::cuda {

absl::Status CudaErrorStatus(cudaError_t error, const char* statement, const char* file, int line);
absl::Status CublasErrorStatus(cublasStatus_t error, const char* statement, const char* file,
                               int line);
// Adds the fatal-device payload to a non-OK status.
absl::Status MarkFatal(absl::Status status);

// True for the errors CUDA documents as leaving the context unusable (an illegal address,
// a failed or timed-out launch, a device assert, an uncorrectable ECC error, ...).
bool IsStickyCudaError(cudaError_t error);

// Where an allocation lands: cudaMalloc (device) or cudaMallocHost (pinned host memory).
enum class MemoryKind { kDevice, kPinnedHost };

// The status of an allocation call that returned `error` for `bytes`: OK on success;
// RESOURCE_EXHAUSTED, not fatal, when memory ran out; the fatal INTERNAL status of any other
// failure.
absl::Status AllocationStatus(cudaError_t error, size_t bytes, MemoryKind kind);

// cudaMalloc / cudaMallocHost of max(bytes, 1) through AllocationStatus; a failure also clears
// the thread's last error. *ptr is null after a failure.
absl::Status DeviceAlloc(size_t bytes, void** ptr);
absl::Status PinnedAlloc(size_t bytes, void** ptr);

// After a failed graph capture or instantiation. `failure`: the CUDA error the capture or
// instantiation returned (cudaSuccess where only a cuBLAS call failed); `health`: what a
// stream synchronisation returned once the last error was cleared. The eager run of the same
// step has just succeeded, so the step's shape can keep running eagerly unless the context
// itself is broken.
enum class GraphFailureAction { kRunEagerly, kFatal };
GraphFailureAction AfterGraphFailure(cudaError_t failure, cudaError_t health);

// What CudaDeviceAvailable learned about `device`: cudaGetDeviceCount's answer and, for a
// listed device, the result of creating a context on it and allocating a few bytes there.
struct DeviceProbe {
  int device = 0;
  cudaError_t count_error = cudaSuccess;
  int count = 0;
  cudaError_t context_error = cudaSuccess;
};
// OK when the device is listed and a context and an allocation could be made on it;
// UNAVAILABLE otherwise, with CUDA's error text and what the failure usually means.
absl::Status DeviceProbeStatus(const DeviceProbe& probe);

}  // namespace prefixd::cuda

#define PREFIXD_CUDA_RETURN_IF_ERROR(stmt)                                                     \
  do {                                                                                         \
    const cudaError_t prefixd_cuda_error_ = (stmt);                                            \
    if (prefixd_cuda_error_ != cudaSuccess) [[unlikely]] {                                     \
      return ::prefixd::cuda::CudaErrorStatus(prefixd_cuda_error_, #stmt, __FILE__, __LINE__); \
    }                                                                                          \
  } while (0)

#define PREFIXD_CUBLAS_RETURN_IF_ERROR(stmt)                                                       \
  do {                                                                                             \
    const cublasStatus_t prefixd_cublas_error_ = (stmt);                                           \
    if (prefixd_cublas_error_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                             \
      return ::prefixd::cuda::CublasErrorStatus(prefixd_cublas_error_, #stmt, __FILE__, __LINE__); \
    }                                                                                              \
  } while (0)

#endif  // PREFIXD_KERNELS_CUDA_CUDA_CHECK_H_
