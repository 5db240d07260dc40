// Turning CUDA and cuBLAS error codes into absl::Status at the call site.
//
// PREFIXD_CUDA_RETURN_IF_ERROR(stmt) / PREFIXD_CUBLAS_RETURN_IF_ERROR(stmt) evaluate `stmt`
// once and, if it failed, return from the enclosing function (which returns absl::Status)
// an INTERNAL status naming the statement, file, line and CUDA's error name and text,
// carrying the kFatalDeviceErrorPayload. Kernel launchers return cudaGetLastError(), so a
// launch is checked the same way. Never exits the process.
#ifndef PREFIXD_KERNELS_CUDA_CUDA_CHECK_H_
#define PREFIXD_KERNELS_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace prefixd::cuda {

absl::Status CudaErrorStatus(cudaError_t error, const char* statement, const char* file, int line);
absl::Status CublasErrorStatus(cublasStatus_t error, const char* statement, const char* file,
                               int line);
// Adds the fatal-device payload to a non-OK status.
absl::Status MarkFatal(absl::Status status);

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
