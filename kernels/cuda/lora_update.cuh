// LoRA's low-rank update after a targeted product (engine/lora_adapter.h), for every row of a
// pass with its own adapter:
//   y[row, o] += sum over j of t[j] · B[o, j],  t[j] = scaling · sum over k of x[row, k] · A[j, k]
// with x, A and B in the dtype and all arithmetic in fp32 (y is the fp32 product buffer).
// Rows whose entry is null (the base, graph padding) or whose adapter leaves the module alone
// are not touched.
//
// Why one kernel over per-row tables (Punica's BGMV) rather than two cuBLAS GEMMs per
// adapter segment: the launch depends only on the pass's row count and the module, never on
// which adapters the rows have, where their segments start or what rank they are, so a decode
// batch captured as a CUDA graph replays with any mix of adapters (the per-row table is
// uploaded before each replay, like the rest of the pass's metadata) and the graph key needs
// only "has adapters or not". Per-segment GEMMs would put the segment layout into the graph
// key (one graph per layout) or force adapter steps to run eagerly, with 2 x segments GEMMs
// per module per layer. The cost: each row re-reads its adapter's A and B (from L2 within a
// pass), which is negligible at decode and at the ranks fine-tunes use; a tensor-core
// segmented kernel (SGMV) for long adapter prefills is possible future work.
//
// The K/V of an adapter's rows depend on this arithmetic (cache blocks of an adapter are keyed
// by its digest, and move between processes only under an equal kv_numerics()): a change to
// it must change the backend's kv_numerics string, as for any other kernel.
//
// One block per row: its warps compute t (warp w takes j = w, w + warps, ...: a strided fp32
// FMA chain over k per lane, then a warp sum), keep it in shared memory, then its threads
// stride over o, each adding one fp32 FMA chain over j in order to y.
#ifndef PREFIXD_KERNELS_CUDA_LORA_UPDATE_CUH_
#define PREFIXD_KERNELS_CUDA_LORA_UPDATE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/dtype.h"

namespace prefixd::cuda {

// The largest rank the kernel takes (its t lives in shared memory: 16 KiB). Equal to
// kCudaLoraMaxRank (lora_plan.h, which includes no CUDA header; the backend asserts it).
inline constexpr int32_t kLoraUpdateMaxRank = 4096;

// One module of one adapter's device copy (kernels/cuda/lora_plan.h's arena): a is [rank, in],
// b is B transposed, [rank, out], both dtype; both null when the adapter leaves it alone.
struct LoraModuleDevice {
  const void* a = nullptr;
  const void* b = nullptr;
};

// One row's entry of a pass's table. modules: the adapter's table of n_layer x 4 modules
// (entry layer * 4 + target), null for a row without an adapter.
struct LoraRowDevice {
  const LoraModuleDevice* modules = nullptr;
  int32_t rank = 0;  // 1 .. kLoraUpdateMaxRank
  float scaling = 0.0f;
};

struct LoraUpdateArgs {
  const LoraRowDevice* rows = nullptr;  // [num_rows] device
  int32_t num_rows = 0;
  int32_t module = 0;       // layer * 4 + LoraTarget
  const void* x = nullptr;  // [num_rows, ld_x] dtype: the product's input
  int64_t ld_x = 0;
  int32_t in = 0;
  float* y = nullptr;  // [num_rows, ld_y] fp32: the product's output
  int64_t ld_y = 0;
  int32_t out = 0;
};

cudaError_t LaunchLoraUpdate(DType dtype, const LoraUpdateArgs& args, cudaStream_t stream);

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_LORA_UPDATE_CUH_
