#include "kernels/cuda/cuda_check.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_backend.h"

namespace prefixd::cuda {

absl::Status MarkFatal(absl::Status status) {
  if (!status.ok()) status.SetPayload(kFatalDeviceErrorPayload, absl::Cord("1"));
  return status;
}

absl::Status CudaErrorStatus(cudaError_t error, const char* statement, const char* file, int line) {
  return MarkFatal(
      absl::InternalError(absl::StrFormat("%s:%d: %s: %s: %s", file, line, statement,
                                          cudaGetErrorName(error), cudaGetErrorString(error))));
}

absl::Status CublasErrorStatus(cublasStatus_t error, const char* statement, const char* file,
                               int line) {
  return MarkFatal(absl::InternalError(absl::StrFormat("%s:%d: %s: %s: %s", file, line, statement,
                                                       cublasGetStatusName(error),
                                                       cublasGetStatusString(error))));
}

}  // namespace prefixd::cuda
