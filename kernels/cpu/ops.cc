#include "kernels/cpu/ops.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/container/inlined_vector.h"

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

// scores[i] = Dot(q, keys + i * n, n) * scale for i in [0, 8), n a multiple of 8, with
// exactly Dot's arithmetic: per key, 8 lane-wise fma chains over n, then the lanes added left
// to right from 0. The 8 keys' lane vectors are transposed so that those left-to-right sums
// run as 8 vertical adds over all keys at once instead of 8 serial scalar chains per key.
inline void Dot8Keys(const float* q, const float* keys, int64_t n, float scale, float* scores) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int j = 0; j < 8; ++j)
      acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + j * n + i), acc[j]);
  }
  // 8x8 transpose: t[l] holds lane l of every key.
  const __m256 u0 = _mm256_unpacklo_ps(acc[0], acc[1]), u1 = _mm256_unpackhi_ps(acc[0], acc[1]);
  const __m256 u2 = _mm256_unpacklo_ps(acc[2], acc[3]), u3 = _mm256_unpackhi_ps(acc[2], acc[3]);
  const __m256 u4 = _mm256_unpacklo_ps(acc[4], acc[5]), u5 = _mm256_unpackhi_ps(acc[4], acc[5]);
  const __m256 u6 = _mm256_unpacklo_ps(acc[6], acc[7]), u7 = _mm256_unpackhi_ps(acc[6], acc[7]);
  const __m256 s0 = _mm256_shuffle_ps(u0, u2, 0x44), s1 = _mm256_shuffle_ps(u0, u2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(u1, u3, 0x44), s3 = _mm256_shuffle_ps(u1, u3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(u4, u6, 0x44), s5 = _mm256_shuffle_ps(u4, u6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(u5, u7, 0x44), s7 = _mm256_shuffle_ps(u5, u7, 0xEE);
  const __m256 t[8] = {
      _mm256_permute2f128_ps(s0, s4, 0x20), _mm256_permute2f128_ps(s1, s5, 0x20),
      _mm256_permute2f128_ps(s2, s6, 0x20), _mm256_permute2f128_ps(s3, s7, 0x20),
      _mm256_permute2f128_ps(s0, s4, 0x31), _mm256_permute2f128_ps(s1, s5, 0x31),
      _mm256_permute2f128_ps(s2, s6, 0x31), _mm256_permute2f128_ps(s3, s7, 0x31)};
  __m256 sum = _mm256_setzero_ps();
  for (int l = 0; l < 8; ++l) sum = _mm256_add_ps(sum, t[l]);
  _mm256_storeu_ps(scores, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
}

// max(x[0..n)), n >= 1, 8 lanes at a time (a max is exact, so the grouping cannot change
// it; one scalar compare chain would be bound by its latency).
inline float MaxOf(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = lanes[0];
  for (int l = 1; l < 8; ++l) r = std::max(r, lanes[l]);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

// out[0..8 NV) (+)= sum over r in order of w[r] * values[r], each element one fma chain (the
// same arithmetic as Axpy over r), continuing from `out` unless `first` (then from 0), with
// the accumulators in registers across the rows.
template <int NV>
inline void AccumulateValues(const float* w, const float* values, int32_t rows, bool first,
                             float* out) {
  __m256 acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + 8 * v);
  for (int32_t r = 0; r < rows; ++r) {
    const __m256 wv = _mm256_set1_ps(w[r]);
    const float* row = values + r * 8 * NV;
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(row + 8 * v), acc[v]);
  }
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + 8 * v, acc[v]);
}

// sums[r] = x[r][0] + x[r][1] + ... + x[r][n[r] - 1], added left to right from 0.0f, for
// r < count <= kSumsAtOnce. The rows' chains are interleaved in one loop: each is still its
// own in-order chain (the same bits as summing the rows one by one), but the adds' latency,
// which bounds a single chain, overlaps across them.
constexpr size_t kSumsAtOnce = 4;
inline void SumsInOrder(const float* const* x, const int32_t* n, size_t count, float* sums) {
  float s[kSumsAtOnce] = {};
  int32_t common = n[0];
  for (size_t r = 1; r < count; ++r) common = std::min(common, n[r]);
  int32_t k = 0;
  if (count == kSumsAtOnce) {
    for (; k < common; ++k) {
      s[0] += x[0][k];
      s[1] += x[1][k];
      s[2] += x[2][k];
      s[3] += x[3][k];
    }
  }
  for (size_t r = 0; r < count; ++r) {
    for (int32_t i = k; i < n[r]; ++i) s[r] += x[r][i];
    sums[r] = s[r];
  }
}

// y[0..n) += w * x[0..n)
inline void Axpy(float w, const float* x, float* y, int64_t n) {
  const __m256 wv = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(w, x[i], y[i]);
}

// Prefetches the cache lines of [p, p + bytes) into L1 (_MM_HINT_T0) or L2 only (_MM_HINT_T1).
template <int kHint>
inline void PrefetchLines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) {
    // Spelled out: g++ takes the hint as an enum type that clang does not have.
    if constexpr (kHint == _MM_HINT_T0) {
      _mm_prefetch(c + off, _MM_HINT_T0);
    } else {
      _mm_prefetch(c + off, _MM_HINT_T1);
    }
  }
}

// Visits every (key block index, chunk, head, query of the chunk that sees the block), block
// index outermost: fn(chunk, head - first_head, query, position of the block's first key, keys
// of the block the query sees, the block's K (kv 0) or V (kv 1) rows for that head). Query i of
// a chunk sees keys [0, pos0 + i].
//
// A block holds each layer's heads one after another, so the heads of one (block, chunk) are
// one contiguous run of num_heads segments of a few KiB each, at a stride of a whole block
// (every layer) from the next block. The hardware prefetchers start cold on each run and a
// decode query, whose arithmetic per segment is short, would wait on memory segment after
// segment. Before each segment is used, the next distinct one is prefetched into L1 and the
// one kL2SegmentsAhead on into L2 only: the L1 tracks few misses at once, so L1 prefetches
// alone leave the stream waiting on those few, while L2's longer miss queue keeps three
// segments in flight and the L1 prefetch then finds its lines there (bench/attention_bench;
// figures in docs/BENCHMARKS.md).
// Longer runs (more heads per call) let the hardware prefetchers stream too. Prefetching reads
// nothing into the arithmetic.
template <typename F>
inline void ForEachBlockAndQuery(absl::Span<const AttentionChunk> chunks, int32_t max_keys,
                                 const float* kv, const KvGeometry& g, int32_t layer, int32_t which,
                                 int32_t first_head, int32_t num_heads, F fn) {
  constexpr size_t kL2SegmentsAhead = 3;
  struct Segment {
    uint32_t chunk;
    int32_t head;  // from first_head
    int32_t j;     // position of the block's first key
    const float* rows;
    int64_t bytes;  // the rows any query of the chunk reads
  };
  const int32_t bs = g.block_size;
  absl::InlinedVector<Segment, 64> order;
  for (int32_t j = 0, b = 0; j < max_keys; j += bs, ++b) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      const int32_t end = chunks[c].pos0 + chunks[c].num_queries;
      if (j >= end) continue;
      const float* rows = kv + g.Offset(chunks[c].block_table[b], layer, which, first_head, 0);
      const int64_t bytes = int64_t{std::min(bs, end - j)} * g.head_dim * int64_t{sizeof(float)};
      for (int32_t h = 0; h < num_heads; ++h) {
        order.push_back({static_cast<uint32_t>(c), h, j, rows + h * g.head_stride(), bytes});
      }
    }
  }
  // Chunks on a shared prefix visit the same segment one after another: the look-ahead counts
  // distinct segments (`distinct` holds the visit where each one first appears). Counting
  // visits would prefetch the segment in hand again and again (8 chunks on one prefix: 8
  // times the prefetch instructions) and reach the next block only a visit before its use.
  absl::InlinedVector<uint32_t, 64> distinct;
  for (size_t v = 0; v < order.size(); ++v) {
    if (v == 0 || order[v].rows != order[v - 1].rows) distinct.push_back(static_cast<uint32_t>(v));
  }
  auto to_l1 = [&](size_t d) {
    if (d < distinct.size())
      PrefetchLines<_MM_HINT_T0>(order[distinct[d]].rows, order[distinct[d]].bytes);
  };
  auto to_l2 = [&](size_t d) {
    if (d < distinct.size())
      PrefetchLines<_MM_HINT_T1>(order[distinct[d]].rows, order[distinct[d]].bytes);
  };
  for (size_t d = 1; d < kL2SegmentsAhead; ++d) to_l2(d);
  to_l1(0);
  for (size_t v = 0, d = 0; v < order.size(); ++v) {
    if (d < distinct.size() && distinct[d] == v) {
      to_l2(d + kL2SegmentsAhead);
      to_l1(d + 1);
      ++d;
    }
    const Segment& s = order[v];
    const AttentionChunk& ch = chunks[s.chunk];
    for (int32_t i = std::max(0, s.j - ch.pos0); i < ch.num_queries; ++i) {
      fn(s.chunk, s.head, i, s.j, std::min(bs, ch.pos0 + i + 1 - s.j), s.rows);
    }
  }
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
  AttendQueries(q, 0, 1, pos, kv, g, block_table, layer, head, scratch, out, 0);
}

void AttendQueries(const float* q, int64_t q_stride, int32_t num_queries, int32_t pos0,
                   const float* kv, const KvGeometry& g, const int32_t* block_table, int32_t layer,
                   int32_t head, float* scratch, float* out, int64_t out_stride) {
  const AttentionChunk chunk{q, q_stride, num_queries, pos0, block_table, out, out_stride};
  AttendChunks({&chunk, 1}, kv, g, layer, head, /*num_heads=*/1, scratch);
}

int64_t AttendChunksScratch(absl::Span<const AttentionChunk> chunks, int32_t num_heads) {
  int64_t n = 0;
  for (const AttentionChunk& c : chunks) n += int64_t{c.num_queries} * (c.pos0 + c.num_queries + 8);
  return n * num_heads;
}

void AttendChunks(absl::Span<const AttentionChunk> chunks, const float* kv, const KvGeometry& g,
                  int32_t layer, int32_t first_head, int32_t num_heads, float* scratch) {
  const int32_t hd = g.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Scores of (chunk c, head h): num_queries rows of (keys seen by its last query + 8) floats
  // at scores[c * num_heads + h].
  absl::InlinedVector<float*, 64> scores(chunks.size() * num_heads);
  int32_t max_keys = 0;
  auto s_stride = [&](size_t c) { return int64_t{chunks[c].pos0} + chunks[c].num_queries + 8; };
  float* next = scratch;
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (int32_t h = 0; h < num_heads; ++h) {
      scores[c * num_heads + h] = next;
      next += chunks[c].num_queries * s_stride(c);
    }
    max_keys = std::max(max_keys, chunks[c].pos0 + chunks[c].num_queries);
  }
  // Query i of chunk c for head h, and its output.
  auto query = [&](size_t c, int32_t h, int32_t i) {
    return chunks[c].q + i * chunks[c].q_stride + int64_t{h} * hd;
  };
  auto output = [&](size_t c, int32_t h, int32_t i) {
    return chunks[c].out + i * chunks[c].out_stride + int64_t{h} * hd;
  };
  // Scores, one key block index at a time for every chunk, head and query that sees it: a
  // block that several chunks' tables share is read once and stays in L1 for the others.
  ForEachBlockAndQuery(
      chunks, max_keys, kv, g, layer, /*which=*/0, first_head, num_heads,
      [&](size_t c, int32_t h, int32_t i, int32_t j, int32_t rows, const float* keys) {
        const float* qi = query(c, h, i);
        float* si = scores[c * num_heads + h] + i * s_stride(c) + j;
        int32_t r = 0;
        if (hd % 8 == 0) {
          for (; r + 8 <= rows; r += 8) Dot8Keys(qi, keys + int64_t{r} * hd, hd, scale, si + r);
        }
        for (; r < rows; ++r) si[r] = Dot(qi, keys + int64_t{r} * hd, hd) * scale;
      });
  // Softmax weights per query (unnormalised; each output is divided by its sum at the end),
  // the sums in (chunk, head, query) order.
  absl::InlinedVector<const float*, 64> weights;
  absl::InlinedVector<int32_t, 64> counts;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const AttentionChunk& ch = chunks[c];
    for (int32_t h = 0; h < num_heads; ++h) {
      for (int32_t i = 0; i < ch.num_queries; ++i) {
        float* si = scores[c * num_heads + h] + i * s_stride(c);
        const int32_t n = ch.pos0 + i + 1;
        const float max_score = MaxOf(si, n);
        for (int32_t k = 0; k < n; ++k) si[k] -= max_score;
        ExpInPlace(si, n);
        weights.push_back(si);
        counts.push_back(n);
      }
    }
  }
  absl::InlinedVector<float, 64> sums(weights.size());
  for (size_t q = 0; q < weights.size(); q += kSumsAtOnce) {
    SumsInOrder(&weights[q], &counts[q], std::min(kSumsAtOnce, weights.size() - q), &sums[q]);
  }
  // Values, again block index by block index; each output element is one fma chain over the
  // keys in position order, carried through `out` between blocks.
  ForEachBlockAndQuery(
      chunks, max_keys, kv, g, layer, /*which=*/1, first_head, num_heads,
      [&](size_t c, int32_t h, int32_t i, int32_t j, int32_t rows, const float* values) {
        const float* wi = scores[c * num_heads + h] + i * s_stride(c) + j;
        float* oi = output(c, h, i);
        const bool first = j == 0;
        switch (hd) {
          case 8:
            return AccumulateValues<1>(wi, values, rows, first, oi);
          case 16:
            return AccumulateValues<2>(wi, values, rows, first, oi);
          case 32:
            return AccumulateValues<4>(wi, values, rows, first, oi);
          case 64:
            return AccumulateValues<8>(wi, values, rows, first, oi);
          default:
            if (first) std::fill(oi, oi + hd, 0.0f);
            for (int32_t r = 0; r < rows; ++r) Axpy(wi[r], values + int64_t{r} * hd, oi, hd);
        }
      });
  size_t q_index = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (int32_t h = 0; h < num_heads; ++h) {
      for (int32_t i = 0; i < chunks[c].num_queries; ++i) {
        const float inv = 1.0f / sums[q_index++];
        float* oi = output(c, h, i);
        for (int32_t d = 0; d < hd; ++d) oi[d] *= inv;
      }
    }
  }
}

// Attention tasks per thread of the pool where the heads and chunks allow: enough that the
// dynamic task queue evens out threads that run at different speeds.
constexpr int64_t kAttentionTasksPerThread = 4;

int32_t AttentionHeadsPerTask(int32_t n_head, absl::Span<const AttentionChunk> chunks,
                              int threads) {
  // Chunks that start from the same block (one prompt's chunks, or sequences on a cached
  // common prefix) read the same K/V: one task per head over all of them reads each block
  // once per head and from L1 for the rest.
  absl::InlinedVector<int32_t, 64> first_blocks;
  for (const AttentionChunk& c : chunks) first_blocks.push_back(c.block_table[0]);
  std::sort(first_blocks.begin(), first_blocks.end());
  if (std::adjacent_find(first_blocks.begin(), first_blocks.end()) != first_blocks.end()) {
    return 1;
  }
  // Sequences of their own: as many heads per task as leaves kAttentionTasksPerThread tasks
  // per thread.
  const int64_t num_chunks = std::max<int64_t>(1, static_cast<int64_t>(chunks.size()));
  const int64_t head_groups =
      std::clamp<int64_t>((kAttentionTasksPerThread * threads + num_chunks - 1) / num_chunks, 1,
                          n_head);
  return static_cast<int32_t>((n_head + head_groups - 1) / head_groups);
}

void AttendBatch(absl::Span<const AttentionChunk> chunks, const float* kv, const KvGeometry& g,
                 int32_t layer, int32_t heads_per_task, ThreadPool* pool) {
  const int32_t hd = g.head_dim;
  heads_per_task = std::clamp(heads_per_task, 1, g.n_head);
  const int32_t head_groups = (g.n_head + heads_per_task - 1) / heads_per_task;
  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
  const int64_t groups = std::min<int64_t>(
      num_chunks, (kAttentionTasksPerThread * pool->num_threads() + head_groups - 1) / head_groups);
  pool->Run(head_groups * groups, [&](int64_t task) {
    thread_local std::vector<float> scratch;
    thread_local std::vector<AttentionChunk> group;
    const int32_t head = static_cast<int32_t>(task / groups) * heads_per_task;
    const int32_t num_heads = std::min(heads_per_task, g.n_head - head);
    const int64_t gi = task % groups;
    group.clear();
    for (int64_t ci = gi * num_chunks / groups; ci < (gi + 1) * num_chunks / groups; ++ci) {
      AttentionChunk c = chunks[ci];
      c.q += int64_t{head} * hd;
      c.out += int64_t{head} * hd;
      group.push_back(c);
    }
    const size_t need = static_cast<size_t>(AttendChunksScratch(group, num_heads));
    if (scratch.size() < need) scratch.resize(need);
    AttendChunks(group, kv, g, layer, head, num_heads, scratch.data());
  });
}

}  // namespace prefixd
