// The low-rank update of one row, for LoRA adapters (engine/lora_adapter.h):
//   y[o] += sum over j of t[j] · B[o, j],  t[j] = scaling · sum over k of x[k] · A[j, k]
// in fp32 with one fixed order per element: t[j] is one FMA chain over k in order, then one
// multiplication by `scaling`; y[o] is one FMA chain over j in order that starts from the
// y[o] it is given. The loops run over j (and o) in the inner position, so they vectorise
// without changing any chain, and the result depends on nothing but the row, the module and
// the y it starts from: not on the batch, the threads or the instruction set.
#ifndef PREFIXD_KERNELS_CPU_LORA_OPS_H_
#define PREFIXD_KERNELS_CPU_LORA_OPS_H_

#include <cstdint>

#include "engine/lora_adapter.h"

namespace prefixd {

// y[0 .. m.out) += the update of x[0 .. m.in) (above). `t` has room for `rank` floats.
void AddLoraUpdateRow(const LoraModule& m, int32_t rank, float scaling, const float* x, float* y,
                      float* t);

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CPU_LORA_OPS_H_
