#include "kernels/cpu/lora_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace prefixd {
namespace {

// Outputs per block of the B product: the block's partial sums stay in registers (8 AVX2
// vectors) while j runs, instead of a load and a store of y per FMA.
constexpr int64_t kOutBlock = 64;

}  // namespace

void AddLoraUpdateRow(const LoraModule& m, int32_t rank, float scaling,
                      const float* __restrict x, float* __restrict y, float* __restrict t) {
  const int64_t r = rank;
  const float* __restrict a_t = m.a_t.data();  // [in, r]
  const float* __restrict b_t = m.b_t.data();  // [r, out]
  float* __restrict c0 = t;
  float* __restrict c1 = t + r;
  float* __restrict c2 = t + 2 * r;
  float* __restrict c3 = t + 3 * r;
  for (int64_t j = 0; j < kLoraChains * r; ++j) t[j] = 0.0f;
  int64_t k = 0;
  for (; k + kLoraChains <= m.in; k += kLoraChains) {
    const float x0 = x[k], x1 = x[k + 1], x2 = x[k + 2], x3 = x[k + 3];
    const float* a0 = a_t + k * r;
    for (int64_t j = 0; j < r; ++j) {
      c0[j] = std::fma(x0, a0[j], c0[j]);
      c1[j] = std::fma(x1, a0[r + j], c1[j]);
      c2[j] = std::fma(x2, a0[2 * r + j], c2[j]);
      c3[j] = std::fma(x3, a0[3 * r + j], c3[j]);
    }
  }
  for (; k < m.in; ++k) {  // the tail, each k on its own chain
    float* c = t + (k % kLoraChains) * r;
    for (int64_t j = 0; j < r; ++j) c[j] = std::fma(x[k], a_t[k * r + j], c[j]);
  }
  for (int64_t j = 0; j < r; ++j) c0[j] = ((c0[j] + c1[j]) + (c2[j] + c3[j])) * scaling;
  const int64_t out = m.out;
  int64_t o0 = 0;
  for (; o0 + kOutBlock <= out; o0 += kOutBlock) {
    float acc[kOutBlock];
    for (int64_t i = 0; i < kOutBlock; ++i) acc[i] = y[o0 + i];
    for (int64_t j = 0; j < r; ++j) {
      const float tj = c0[j];
      const float* b = b_t + j * out + o0;
      for (int64_t i = 0; i < kOutBlock; ++i) acc[i] = std::fma(tj, b[i], acc[i]);
    }
    for (int64_t i = 0; i < kOutBlock; ++i) y[o0 + i] = acc[i];
  }
  for (int64_t j = 0; j < r && o0 < out; ++j) {
    const float tj = c0[j];
    const float* b = b_t + j * out;
    for (int64_t o = o0; o < out; ++o) y[o] = std::fma(tj, b[o], y[o]);
  }
}

void AddLoraUpdateRowReference(const LoraModule& m, int32_t rank, float scaling, const float* x,
                               float* y) {
  const int64_t r = rank;
  std::vector<float> t(r);
  for (int64_t j = 0; j < r; ++j) {
    float c[kLoraChains] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t k = 0; k < m.in; ++k) {
      c[k % kLoraChains] = std::fma(x[k], m.a_t[k * r + j], c[k % kLoraChains]);
    }
    t[j] = ((c[0] + c[1]) + (c[2] + c[3])) * scaling;
  }
  for (int64_t o = 0; o < m.out; ++o) {
    float acc = y[o];
    for (int64_t j = 0; j < r; ++j) acc = std::fma(t[j], m.b_t[j * m.out + o], acc);
    y[o] = acc;
  }
}

}  // namespace prefixd
