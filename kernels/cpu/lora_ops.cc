#include "kernels/cpu/lora_ops.h"

#include <cmath>

namespace prefixd {

void AddLoraUpdateRow(const LoraModule& m, int32_t rank, float scaling,
                      const float* __restrict x, float* __restrict y, float* __restrict t) {
  const int64_t r = rank;
  const float* a_t = m.a_t.data();  // [in, r]
  const float* b_t = m.b_t.data();  // [r, out]
  for (int64_t j = 0; j < r; ++j) t[j] = 0.0f;
  for (int64_t k = 0; k < m.in; ++k) {
    const float xk = x[k];
    const float* a = a_t + k * r;
    for (int64_t j = 0; j < r; ++j) t[j] = std::fma(xk, a[j], t[j]);
  }
  for (int64_t j = 0; j < r; ++j) t[j] *= scaling;
  for (int64_t j = 0; j < r; ++j) {
    const float tj = t[j];
    const float* b = b_t + j * m.out;
    for (int64_t o = 0; o < m.out; ++o) y[o] = std::fma(tj, b[o], y[o]);
  }
}

}  // namespace prefixd
