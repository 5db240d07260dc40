#include "kernels/cpu/ops.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>

namespace prefixd {
namespace {

// Cephes expf on 8 lanes. Inputs are clamped to [-87.3, 88.3], which is all softmax (x <= 0,
// underflow to ~1e-38 is harmless there) and the tanh of gelu need.
inline __m256 Exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 lo = _mm256_set1_ps(-87.3365478515625f);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  // n = round(x / ln 2); r = x - n ln 2 in two parts (Cody-Waite) for accuracy.
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // Scale by 2^n through the exponent bits. n in [-126, 128]: split to stay representable.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// Applies f to x[0..n) in groups of 8; the tail goes through a padded copy so that every
// element sees the same instructions.
template <typename F>
inline void Map8(float* x, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float tail[8] = {};
    std::memcpy(tail, x + i, (n - i) * sizeof(float));
    _mm256_store_ps(tail, f(_mm256_load_ps(tail)));
    std::memcpy(x + i, tail, (n - i) * sizeof(float));
  }
}

// Sum of x[0..n) in a fixed order: 8 lane-wise partial sums over full groups, the lanes
// added left to right, then the tail in order.
inline float SumFixed(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float s = 0.0f;
  for (float v : lanes) s += v;
  for (; i < n; ++i) s += x[i];
  return s;
}

inline float Dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float s = 0.0f;
  for (float v : lanes) s += v;
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

// y[0..n) += w * x[0..n)
inline void Axpy(float w, const float* x, float* y, int64_t n) {
  const __m256 wv = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(w, x[i], y[i]);
}

}  // namespace

void ExpInPlace(float* x, int64_t n) { Map8(x, n, Exp8); }

void LayerNormRow(const float* x, int64_t n, const float* gamma, const float* beta, float eps,
                  float* out) {
  const float mean = SumFixed(x, n) / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] - mean;
  // Variance from the centred values (two-pass: no cancellation).
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_loadu_ps(out + i);
    acc = _mm256_fmadd_ps(d, d, acc);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float ss = 0.0f;
  for (float v : lanes) ss += v;
  for (; i < n; ++i) ss = std::fma(out[i], out[i], ss);
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) out[j] = out[j] * rstd * gamma[j] + beta[j];
}

void GeluNewInPlace(float* x, int64_t n) {
  Map8(x, n, [](__m256 v) {
    const __m256 c = _mm256_set1_ps(0.7978845608028654f);  // sqrt(2 / pi)
    const __m256 v3 = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
    const __m256 y =
        _mm256_mul_ps(c, _mm256_add_ps(v, _mm256_mul_ps(_mm256_set1_ps(0.044715f), v3)));
    // tanh(y) = 1 - 2 / (exp(2y) + 1): saturates cleanly to +-1 at both ends.
    const __m256 e = Exp8(_mm256_add_ps(y, y));
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(one, t));
  });
}

void CopyKvRows(float* kv, const KvGeometry& g, int32_t src, int32_t dst, int32_t num_rows) {
  if (src == dst || num_rows <= 0) return;
  for (int32_t l = 0; l < g.n_layer; ++l) {
    for (int32_t which = 0; which < 2; ++which) {
      for (int32_t h = 0; h < g.n_head; ++h) {
        std::memcpy(kv + g.Offset(dst, l, which, h, 0), kv + g.Offset(src, l, which, h, 0),
                    sizeof(float) * num_rows * g.head_dim);
      }
    }
  }
}

void AttendOne(const float* q, int32_t pos, const float* kv, const KvGeometry& g,
               const int32_t* block_table, int32_t layer, int32_t head, float* scratch,
               float* out) {
  const int32_t hd = g.head_dim;
  const int32_t bs = g.block_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int32_t n = pos + 1;
  float max_score = -INFINITY;
  for (int32_t j = 0; j < n; ++j) {
    const float* k = kv + g.Offset(block_table[j / bs], layer, 0, head, j % bs);
    const float s = Dot(q, k, hd) * scale;
    scratch[j] = s;
    if (s > max_score) max_score = s;
  }
  for (int32_t j = 0; j < n; ++j) scratch[j] -= max_score;
  ExpInPlace(scratch, n);
  float sum = 0.0f;
  for (int32_t j = 0; j < n; ++j) sum += scratch[j];
  for (int32_t d = 0; d < hd; ++d) out[d] = 0.0f;
  for (int32_t j = 0; j < n; ++j) {
    const float* v = kv + g.Offset(block_table[j / bs], layer, 1, head, j % bs);
    Axpy(scratch[j], v, out, hd);
  }
  const float inv = 1.0f / sum;
  for (int32_t d = 0; d < hd; ++d) out[d] *= inv;
}

}  // namespace prefixd
