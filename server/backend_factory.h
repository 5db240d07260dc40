// Picks and constructs the backend for --device / --dtype (the server is the composition
// root: the only place that names a concrete backend).
#ifndef PREFIXD_SERVER_BACKEND_FACTORY_H_
#define PREFIXD_SERVER_BACKEND_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"

namespace prefixd {

// CPU KV budget when --kv-cache-bytes is 0 (CUDA then takes a fraction of free memory).
inline constexpr int64_t kDefaultCpuKvCacheBytes = int64_t{256} << 20;

struct DevicePlan {
  bool use_cuda = false;
  DType dtype = DType::kF32;
  std::string note;  // a log line to print (e.g. why auto fell back to the CPU), or empty
};

// --device auto|cpu|cuda, --dtype auto|f32|f16|bf16. `cuda_usable` is CudaDeviceAvailable()'s
// answer (UNAVAILABLE in a build without CUDA). auto: CUDA when usable, else CPU; dtype auto:
// f32 on CPU, bf16 on CUDA. The CPU backend computes in f32 only.
absl::StatusOr<DevicePlan> PlanDevice(std::string_view device, std::string_view dtype,
                                      const absl::Status& cuda_usable);

// CudaDeviceAvailable() when this build has the CUDA backend, else UNAVAILABLE. The probe makes
// a context on device 0, so a device that is listed but unusable (exclusive-process and held
// by another process, a MIG GPU without an instance) is UNAVAILABLE and auto runs on the CPU.
absl::Status CudaUsable();

struct BackendOptions {
  const Model* model = nullptr;
  DevicePlan plan;
  int64_t kv_cache_bytes = 0;  // 0 = default (see kDefaultCpuKvCacheBytes)
  int32_t block_size = 16;
  int32_t threads = 0;
};

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_BACKEND_FACTORY_H_
