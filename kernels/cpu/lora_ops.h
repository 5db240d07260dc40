// The low-rank update of one row, for LoRA adapters (engine/lora_adapter.h):
//   y[o] += sum over j of t[j] · B[o, j],  t[j] = scaling · sum over k of x[k] · A[j, k]
// in fp32 with one fixed order per element, whatever the batch, the threads or the
// instruction set:
//   t[j]: kLoraChains FMA chains, chain q over the k with k % kLoraChains == q in increasing
//         order, combined as ((c0 + c1) + (c2 + c3)), then one multiplication by `scaling`
//         (four chains, not one, so that a rank-8 row, one vector wide, is not bound by the
//         latency of one FMA after another);
//   y[o]: one FMA chain over j in order that starts from the y[o] it is given.
// The loops run over j (and o) in the inner position, so they vectorise without changing any
// chain; the result depends on nothing but the row, the module and the y it starts from.
#ifndef PREFIXD_KERNELS_CPU_LORA_OPS_H_
#define PREFIXD_KERNELS_CPU_LORA_OPS_H_

#include <cstdint>

#include "engine/lora_adapter.h"

namespace prefixd {

inline constexpr int kLoraChains = 4;

// y[0 .. m.out) += the update of x[0 .. m.in) (above). `t` has room for kLoraChains · rank
// floats.
void AddLoraUpdateRow(const LoraModule& m, int32_t rank, float scaling, const float* x, float* y,
                      float* t);

// The obviously-right twin: the same order, element by element in scalar code.
void AddLoraUpdateRowReference(const LoraModule& m, int32_t rank, float scaling, const float* x,
                               float* y);

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CPU_LORA_OPS_H_
