#include "kernels/cuda/cuda_check.h"

#include <algorithm>

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

bool IsStickyCudaError(cudaError_t error) {
  // The errors whose documentation (driver_types.h) says the process is left in an
  // inconsistent state, or that the device cannot be used again.
  switch (error) {
    case cudaErrorECCUncorrectable:
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorExternalDevice:
      return true;
    default:
      return false;
  }
}

absl::Status AllocationStatus(cudaError_t error, size_t bytes, MemoryKind kind) {
  if (error == cudaSuccess) return absl::OkStatus();
  const bool device = kind == MemoryKind::kDevice;
  const char* call = device ? "cudaMalloc" : "cudaMallocHost";
  if (error == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s of %d bytes failed: out of %s memory", call, bytes, device ? "device" : "pinned host"));
  }
  return CudaErrorStatus(error, call, __FILE__, __LINE__);
}

absl::Status DeviceAlloc(size_t bytes, void** ptr) {
  *ptr = nullptr;
  const cudaError_t error = cudaMalloc(ptr, std::max<size_t>(bytes, 1));
  if (error != cudaSuccess) {
    *ptr = nullptr;
    cudaGetLastError();
  }
  return AllocationStatus(error, bytes, MemoryKind::kDevice);
}

absl::Status PinnedAlloc(size_t bytes, void** ptr) {
  *ptr = nullptr;
  const cudaError_t error = cudaMallocHost(ptr, std::max<size_t>(bytes, 1));
  if (error != cudaSuccess) {
    *ptr = nullptr;
    cudaGetLastError();
  }
  return AllocationStatus(error, bytes, MemoryKind::kPinnedHost);
}

GraphFailureAction AfterGraphFailure(cudaError_t failure, cudaError_t health) {
  return IsStickyCudaError(failure) || health != cudaSuccess ? GraphFailureAction::kFatal
                                                             : GraphFailureAction::kRunEagerly;
}

absl::Status DeviceProbeStatus(const DeviceProbe& p) {
  if (p.count_error != cudaSuccess) {
    return absl::UnavailableError(absl::StrFormat("no usable CUDA device: %s: %s",
                                                  cudaGetErrorName(p.count_error),
                                                  cudaGetErrorString(p.count_error)));
  }
  if (p.device < 0 || p.device >= p.count) {
    return absl::UnavailableError(
        absl::StrFormat("CUDA device %d does not exist (%d devices)", p.device, p.count));
  }
  if (p.context_error == cudaSuccess) return absl::OkStatus();
  const char* hint =
      p.context_error == cudaErrorDevicesUnavailable
          ? "the device is busy: in exclusive-process compute mode another process holds it"
          : "a device in exclusive-process mode held by another process, or a MIG-enabled GPU "
            "without a GPU instance, does this";
  return absl::UnavailableError(absl::StrFormat(
      "CUDA device %d is listed but no context or allocation can be made on it: %s: %s (%s)",
      p.device, cudaGetErrorName(p.context_error), cudaGetErrorString(p.context_error), hint));
}

}  // namespace prefixd::cuda

namespace prefixd {

bool CudaDeviceIsInterpreted() {
#ifdef PREFIXD_CUDA_INTERPRET
  return true;
#else
  return false;
#endif
}

// Declared in kernels/cuda/cuda_backend.h (which includes no CUDA header); defined here,
// beside DeviceProbeStatus.
absl::Status CudaDeviceAvailable(int device) {
  cuda::DeviceProbe probe;
  probe.device = device;
  probe.count_error = cudaGetDeviceCount(&probe.count);
  if (probe.count_error == cudaSuccess && device >= 0 && device < probe.count) {
    // Being listed is not being usable: an exclusive-process device held by another process
    // or a MIG GPU without an instance fails only when a context is made. cudaSetDevice makes
    // the primary context; a small allocation proves it works. The caller's current device
    // is restored.
    int previous = -1;
    const bool had_device = cudaGetDevice(&previous) == cudaSuccess;
    probe.context_error = cudaSetDevice(device);
    if (probe.context_error == cudaSuccess) {
      void* p = nullptr;
      probe.context_error = cudaMalloc(&p, 256);
      if (probe.context_error == cudaSuccess) cudaFree(p);
    }
    if (had_device && previous != device) cudaSetDevice(previous);
  }
  cudaGetLastError();  // the probe's failures are answered here, not by a later launch
  return cuda::DeviceProbeStatus(probe);
}

}  // namespace prefixd
