// The CUDA implementation of Backend (engine/backend.h): GPT-2 forward on one device, with
// weights and KV in fp16, bf16 or fp32 and all arithmetic accumulated in fp32.
//
// What it holds, allocated once at creation and never grown:
//  - the weights, converted to `dtype` and uploaded once;
//  - the KV pool, `num_blocks()` blocks plus one scratch block (kernels/cuda/kv_pool_layout.h),
//    the scratch block included in the budget and in memory_usage().kv_pool_bytes, with
//    headroom left free on the device (kernels/cuda/kv_budget.h);
//  - activation buffers for `max_step_tokens` tokens and `max_logit_rows` logit rows per
//    internal pass (a larger Forward() is split into passes, chunks of one sequence in order);
//  - one CUDA graph per decode batch-size bucket (1, 2, 4, ..., 256), captured on first use
//    (one more per bucket for decode batches with LoRA adapters).
//    A bucket whose capture or instantiation fails while the device is healthy runs eagerly
//    from then on, counted in counters().graph_fallbacks and logged; the step that tried it
//    has already produced its logits eagerly.
//
// LoRA (applies_lora() is true): each row of a batch gets its own adapter's update after
// each targeted product (kernels/cuda/lora_update.cuh), from device copies of the adapters
// that are the one thing allocated after creation (bounded by max_device_adapters and
// adapter_cache_bytes, reported in memory_usage().adapter_bytes). Compiled, not yet run on a
// GPU (scripts/gpu-check runs its tests).
//
// Errors: invalid input (token out of vocab, position past the context, block table too short,
// block id out of range) is INVALID_ARGUMENT and changes nothing. Any CUDA or cuBLAS failure
// (other than out-of-memory at start-up, RESOURCE_EXHAUSTED, and a failed graph capture)
// is INTERNAL with the failing statement, file and line, marked fatal (IsFatalDeviceError):
// the backend then refuses every later call with that same status, since device state (KV
// rows, a half-finished step) can no longer be trusted. The server fails requests in flight,
// turns health to NOT_SERVING and exits non-zero.
//
// This header includes no CUDA headers, so the server can include it in any build that links
// prefixd_kernels_cuda.
#ifndef PREFIXD_KERNELS_CUDA_CUDA_BACKEND_H_
#define PREFIXD_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cache/kv_pool.h"
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"

namespace prefixd {

struct CudaBackendOptions {
  const Model* model = nullptr;  // read during CreateCudaBackend only (weights are copied)
  DType dtype = DType::kBF16;
  // kv_pool.budget_bytes: the KV pool in bytes, its scratch block included; at most the
  // device memory left free after the weights and activation buffers less a headroom
  // (kernels/cuda/kv_budget.h). 0: kv_cache_fraction of that free memory, within the same
  // headroom.
  KvPoolOptions kv_pool;
  double kv_cache_fraction = 0.8;
  int device = 0;
  // Replay decode-only steps (one token per sequence) as CUDA graphs.
  bool use_cuda_graphs = true;
  // Activation buffers are sized for this many tokens and logit rows per pass.
  int32_t max_step_tokens = 4096;
  int32_t max_logit_rows = 256;
  // LoRA adapters' device copies (A and B in `dtype`, uploaded on first use, keyed by the
  // adapter's digest): at most this many, and this many bytes, stay resident between steps,
  // least recently used evicted first. A step's own adapters are always made resident, even
  // beyond the caps. The byte cap is kept out of the KV pool's share of free memory.
  int32_t max_device_adapters = 32;
  int64_t adapter_cache_bytes = int64_t{256} << 20;
  // Fault injection: asked before each CUDA graph instantiation; true fails that
  // instantiation as cudaErrorNotSupported would, so that the eager fallback can be exercised
  // on a device where instantiation works. Unset: every instantiation is real.
  std::function<bool()> graph_instantiation_fault;
};

// OK when `device` exists, the driver is usable and a context and a small allocation can be
// made on it (which creates the device's primary context); UNAVAILABLE with CUDA's own error
// text otherwise ("CUDA driver version is insufficient for CUDA runtime version" on a machine
// without a GPU; cudaErrorDevicesUnavailable for an exclusive-process device held by another
// process). For the server's --device auto. Leaves the calling thread's current device as it
// was and, where a driver is present, no last error behind.
absl::Status CudaDeviceAvailable(int device = 0);

// True in an interpret build (PREFIXD_CUDA_INTERPRET): the device is kernels/cuda/interpret
// running on the CPU. Its backend names itself so (device_name(), kv_numerics()), and the
// server's --device auto does not pick it.
bool CudaDeviceIsInterpreted();

// UNAVAILABLE when no usable device, INVALID_ARGUMENT for bad options (the KV pool's from
// ValidateKvPoolOptions, naming the flags) or an unsupported model shape (head_dim > 128),
// RESOURCE_EXHAUSTED when the weights, the buffers (device or pinned host memory) or the KV
// budget do not fit, INTERNAL (fatal) for other CUDA failures.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CUDA_CUDA_BACKEND_H_
