#include "server/backend_factory.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef PREFIXD_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace prefixd {

absl::StatusOr<DevicePlan> PlanDevice(std::string_view device, std::string_view dtype,
                                      const absl::Status& cuda_usable) {
  DevicePlan plan;
  if (device == "cuda") {
    if (!cuda_usable.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--device=cuda but no usable CUDA device: ", cuda_usable.message(),
                       " (use --device=cpu or --device=auto)"));
    }
    plan.use_cuda = true;
  } else if (device == "auto") {
    plan.use_cuda = cuda_usable.ok();
    if (!plan.use_cuda) {
      plan.note = absl::StrCat("--device=auto: running on the CPU (", cuda_usable.message(), ")");
    }
  } else if (device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", std::string(device), " is not one of auto, cpu, cuda"));
  }
  if (dtype == "auto") {
    plan.dtype = plan.use_cuda ? DType::kBF16 : DType::kF32;
  } else if (std::optional<DType> d = ParseDType(dtype)) {
    plan.dtype = *d;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype=", std::string(dtype), " is not one of auto, f32, f16, bf16"));
  }
  if (!plan.use_cuda && plan.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype=", std::string(dtype),
                     " needs CUDA: the CPU backend computes in f32 (use --dtype=f32)"));
  }
  return plan;
}

absl::Status CudaUsable() {
#ifdef PREFIXD_HAVE_CUDA
  return CudaDeviceAvailable(0);
#else
  return absl::UnavailableError("this build of prefixd has no CUDA backend");
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.plan.use_cuda) {
#ifdef PREFIXD_HAVE_CUDA
    CudaBackendOptions cuda;
    cuda.model = options.model;
    cuda.dtype = options.plan.dtype;
    cuda.kv_cache_bytes = options.kv_cache_bytes;
    cuda.block_size = options.block_size;
    return CreateCudaBackend(cuda);
#else
    return absl::UnavailableError("this build of prefixd has no CUDA backend");
#endif
  }
  CpuBackendOptions cpu;
  cpu.model = options.model;
  cpu.kv_cache_bytes =
      options.kv_cache_bytes > 0 ? options.kv_cache_bytes : kDefaultCpuKvCacheBytes;
  // The pool is touched lazily: a budget past the machine's memory would start and be killed
  // later, mid-request, by the OOM killer. Refuse it while nothing has been accepted.
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0 && cpu.kv_cache_bytes > pages * page_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-bytes ", cpu.kv_cache_bytes, " is more than this machine's ",
                     pages * page_size, " bytes of memory"));
  }
  cpu.block_size = options.block_size;
  cpu.threads = options.threads;
  return CreateCpuBackend(cpu);
}

}  // namespace prefixd
