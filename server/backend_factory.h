// Picks and constructs the backend for --device / --dtype (the server is the composition
// root: the only place that names a concrete backend).
#ifndef PREFIXD_SERVER_BACKEND_FACTORY_H_
#define PREFIXD_SERVER_BACKEND_FACTORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/kv_pool.h"
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"
#include "engine/model_config.h"

namespace prefixd {

// The CPU's KV budget when --kv-cache-bytes is 0 (CUDA then takes a fraction of free memory):
// room for kDefaultCpuKvSequences sequences at the model's full context, so that a batch of
// concurrent requests fits without preempting each other, capped at
// 1 / kDefaultCpuKvMemoryDivisor of the memory this process may use (several replicas may
// share a host).
inline constexpr int64_t kDefaultCpuKvSequences = 16;
inline constexpr int64_t kDefaultCpuKvMemoryDivisor = 4;

struct KvBudget {
  int64_t bytes = 0;
  std::string derivation;  // one log line: how `bytes` was reached
};

// The default above for `config` (fp32 KV, as the CPU backend stores it), given
// `memory_bytes`: physical memory, or a smaller cgroup limit (UsableMemoryBytes()).
KvBudget DefaultCpuKvBudget(const ModelConfig& config, int64_t memory_bytes);

// Physical memory, or the cgroup (v2) memory limit when one is set and smaller; 0 if unknown.
int64_t UsableMemoryBytes();

struct DevicePlan {
  bool use_cuda = false;
  DType dtype = DType::kF32;
  std::string note;  // a log line to print (e.g. why auto fell back to the CPU), or empty
};

// --device auto|cpu|cuda, --dtype auto|f32|f16|bf16|int8. `cuda_usable` is CudaDeviceAvailable()'s
// answer (UNAVAILABLE in a build without CUDA). auto: CUDA when usable, else CPU; dtype auto:
// f32 on CPU, bf16 on CUDA. On the CPU, f16 and bf16 are the weights' storage (rounded at
// load; arithmetic and KV stay fp32); int8 is CPU only (--device=cuda with it is
// INVALID_ARGUMENT, auto picks the CPU).
absl::StatusOr<DevicePlan> PlanDevice(std::string_view device, std::string_view dtype,
                                      const absl::Status& cuda_usable);

// CudaDeviceAvailable() when this build has the CUDA backend, else UNAVAILABLE. The probe makes
// a context on device 0, so a device that is listed but unusable (exclusive-process and held
// by another process, a MIG GPU without an instance) is UNAVAILABLE and auto runs on the CPU.
absl::Status CudaUsable();
// CudaUsable() for --device auto: also UNAVAILABLE where the device is the interpreter of an
// interpret build, which serves --device cuda only (it is a test device, not a fast one).
absl::Status CudaUsableForAuto();

// The backend of a `prefixd` run: what the --device ... flags choose (ServerOptions::device).
struct DeviceOptions {
  std::string device = "auto";  // --device: auto | cpu | cuda (PlanDevice checks it)
  std::string dtype = "auto";   // --dtype: auto | f32 | f16 | bf16 | int8 (PlanDevice)
  KvPoolOptions kv_pool;        // --kv-cache-bytes, --block-size (the backend checks them)
  int32_t threads = 0;          // --threads: CPU backend threads, 0 = all cores (the CPU backend)
};

// The backend `plan` names for `model`, sized by `device`; `log` (may be unset) gets the
// start-up lines (how a default budget was derived). The backend checks its own options.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    const Model& model, const DeviceOptions& device, const DevicePlan& plan,
    const std::function<void(std::string_view)>& log);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_BACKEND_FACTORY_H_
