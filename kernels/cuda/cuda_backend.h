// The CUDA implementation of Backend (engine/backend.h): GPT-2 forward on one device, with
// weights and KV in fp16, bf16 or fp32 and all arithmetic accumulated in fp32.
//
// What it holds, allocated once at creation and never grown:
//  - the weights, converted to `dtype` and uploaded once;
//  - the KV pool, `num_blocks()` blocks plus one scratch block (kernels/cuda/kv_pool_layout.h);
//  - activation buffers for `max_step_tokens` tokens and `max_logit_rows` logit rows per
//    internal pass (a larger Forward() is split into passes, chunks of one sequence in order);
//  - one CUDA graph per decode batch-size bucket (1, 2, 4, ..., 256), captured on first use.
//
// Errors: invalid input (token out of vocab, position past the context, block table too short,
// block id out of range) is INVALID_ARGUMENT and changes nothing. Any CUDA or cuBLAS failure
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
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/model.h"

namespace prefixd {

struct CudaBackendOptions {
  const Model* model = nullptr;  // read during CreateCudaBackend only (weights are copied)
  DType dtype = DType::kBF16;
  // KV pool size in bytes; 0: kv_cache_fraction of the device memory left free after the
  // weights and activation buffers.
  int64_t kv_cache_bytes = 0;
  double kv_cache_fraction = 0.8;
  int32_t block_size = 16;
  int device = 0;
  // Replay decode-only steps (one token per sequence) as CUDA graphs.
  bool use_cuda_graphs = true;
  // Activation buffers are sized for this many tokens and logit rows per pass.
  int32_t max_step_tokens = 4096;
  int32_t max_logit_rows = 256;
};

// OK when `device` exists and the driver is usable; UNAVAILABLE with CUDA's own error text
// otherwise ("CUDA driver version is insufficient for CUDA runtime version" on a machine
// without a GPU). For the server's --device auto.
absl::Status CudaDeviceAvailable(int device = 0);

// UNAVAILABLE when no usable device, INVALID_ARGUMENT for bad options or an unsupported
// model shape (head_dim > 128), RESOURCE_EXHAUSTED when the weights or one KV block do not
// fit, INTERNAL (fatal) for other CUDA failures.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CUDA_CUDA_BACKEND_H_
