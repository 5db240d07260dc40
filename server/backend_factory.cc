#include "server/backend_factory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cache/kv_layout.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
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
        absl::StrCat("--dtype=", std::string(dtype), " is not one of auto, f32, f16, bf16, int8"));
  }
  if (plan.dtype == DType::kI8 && plan.use_cuda) {
    if (device == "cuda") {
      return absl::InvalidArgumentError(
          "--dtype=int8 is CPU only: the CUDA backend has f32, f16 and bf16 weights (use "
          "--device=cpu with int8, or another dtype on CUDA)");
    }
    plan.use_cuda = false;  // --device=auto: int8 runs where it exists
    plan.note = "--device=auto with --dtype=int8: running on the CPU (int8 is CPU only)";
  }
  return plan;
}

int64_t UsableMemoryBytes() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  int64_t bytes = pages > 0 && page_size > 0 ? pages * page_size : 0;
  // A container's limit ("max" when there is none).
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  std::string limit_text;
  int64_t limit = 0;
  if (cgroup >> limit_text && absl::SimpleAtoi(limit_text, &limit) && limit > 0) {
    bytes = bytes > 0 ? std::min(bytes, limit) : limit;
  }
  return bytes;
}

KvBudget DefaultCpuKvBudget(const ModelConfig& config, int64_t memory_bytes) {
  const int64_t per_token = KvBytesPerToken(config.n_layer, config.n_head, config.head_dim(), 4);
  const int64_t want = kDefaultCpuKvSequences * int64_t{config.n_positions} * per_token;
  KvBudget budget;
  budget.bytes = want;
  budget.derivation = absl::StrFormat(
      "default KV budget %d bytes = %d sequences x %d positions x %d bytes per token", want,
      kDefaultCpuKvSequences, config.n_positions, per_token);
  const int64_t cap = memory_bytes / kDefaultCpuKvMemoryDivisor;
  if (memory_bytes > 0 && cap < want) {
    budget.bytes = cap;
    budget.derivation = absl::StrFormat(
        "default KV budget %d bytes = 1/%d of %d bytes of memory (%d sequences x %d positions x "
        "%d bytes per token would be %d bytes); set --kv-cache-bytes to choose",
        cap, kDefaultCpuKvMemoryDivisor, memory_bytes, kDefaultCpuKvSequences, config.n_positions,
        per_token, want);
  } else if (memory_bytes > 0) {
    absl::StrAppend(&budget.derivation, " (under the cap of 1/", kDefaultCpuKvMemoryDivisor, " of ",
                    memory_bytes, " bytes of memory)");
  }
  return budget;
}

absl::Status CudaUsable() {
#ifdef PREFIXD_HAVE_CUDA
  return CudaDeviceAvailable(0);
#else
  return absl::UnavailableError("this build of prefixd has no CUDA backend");
#endif
}

absl::Status CudaUsableForAuto() {
#ifdef PREFIXD_HAVE_CUDA
  if (CudaDeviceIsInterpreted()) {
    return absl::UnavailableError(
        "the CUDA device of this build is interpreted on the CPU (a test build: "
        "PREFIXD_CUDA_INTERPRET); --device=cuda runs on it");
  }
#endif
  return CudaUsable();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    const Model& model, const DeviceOptions& device, const DevicePlan& plan,
    const std::function<void(std::string_view)>& log) {
  if (plan.use_cuda) {
#ifdef PREFIXD_HAVE_CUDA
    CudaBackendOptions cuda;
    cuda.model = &model;
    cuda.dtype = plan.dtype;
    cuda.kv_pool = device.kv_pool;
    return CreateCudaBackend(cuda);
#else
    return absl::UnavailableError("this build of prefixd has no CUDA backend");
#endif
  }
  CpuBackendOptions cpu;
  cpu.model = &model;
  cpu.dtype = plan.dtype;
  cpu.kv_pool = device.kv_pool;
  cpu.threads = device.threads;
  const int64_t memory = UsableMemoryBytes();
  if (cpu.kv_pool.budget_bytes == 0) {
    const KvBudget budget = DefaultCpuKvBudget(model.config(), memory);
    cpu.kv_pool.budget_bytes = budget.bytes;
    if (log) log(budget.derivation);  // the server logs the pool next
  }
  // The pool is touched lazily: a budget past the machine's memory would start and be killed
  // later, mid-request, by the OOM killer. Refuse it while nothing has been accepted.
  if (memory > 0 && cpu.kv_pool.budget_bytes > memory) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-bytes ", cpu.kv_pool.budget_bytes,
                                                   " is more than this machine's ", memory,
                                                   " bytes of memory"));
  }
  // What runs the products (PREFIXD_CPU_ISA can hold it to less): "amx", "avx512", ...
  if (log) log(absl::StrCat("cpu matrix products: ", MatMulIsaInUse()));
  return CreateCpuBackend(cpu);
}

}  // namespace prefixd
