// Row-wise kernels of the GPT-2 forward: layer norm, gelu_new, softmax-attention over paged
// K/V. Each one computes a row (or a (query, head) pair) on its own with every reduction in a
// fixed order that depends only on the row length, so a row's result never depends on the
// batch, the thread that ran it, or where in a vector its elements happened to fall.
#ifndef PREFIXD_KERNELS_CPU_OPS_H_
#define PREFIXD_KERNELS_CPU_OPS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/cpu/thread_pool.h"

namespace prefixd {

// out[i] = exp(x[i]) for i in [0, n), in place allowed. One vectorised polynomial (Cephes
// expf, ~1 ulp) applied identically to every element, tails included.
void ExpInPlace(float* x, int64_t n);

// out = (x - mean) / sqrt(var + eps) * gamma + beta over one row of n.
void LayerNormRow(const float* x, int64_t n, const float* gamma, const float* beta, float eps,
                  float* out);

// gelu_new (tanh form): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in place.
void GeluNewInPlace(float* x, int64_t n);

// Where one layer's K/V rows live. Storage is [num_blocks][n_layer][2 (K, V)][n_head]
// [block_size][head_dim] floats; a block holds every layer so that one BlockCopy is a few
// contiguous copies.
struct KvGeometry {
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;

  int64_t head_stride() const { return int64_t{block_size} * head_dim; }
  int64_t kv_stride() const { return n_head * head_stride(); }
  int64_t layer_stride() const { return 2 * kv_stride(); }
  int64_t block_stride() const { return n_layer * layer_stride(); }
  // Offset of (block, layer, kv, head, row), in floats.
  int64_t Offset(int64_t block, int32_t layer, int32_t kv, int32_t head, int32_t row) const {
    return block * block_stride() + layer * layer_stride() + kv * kv_stride() +
           head * head_stride() + int64_t{row} * head_dim;
  }
};

// Copies token rows [0, num_rows) of every layer's K and V from block src to block dst
// (cache/block_copy.h). Rows at or past num_rows and every other block are left untouched.
void CopyKvRows(float* kv, const KvGeometry& g, int32_t src, int32_t dst, int32_t num_rows);

// Causal attention of one query at absolute position `pos` for one head: keys and values of
// positions 0..pos are read in position order through `block_table`. `scratch` holds at
// least pos + 1 + 8 floats. out has head_dim floats.
void AttendOne(const float* q, int32_t pos, const float* kv, const KvGeometry& g,
               const int32_t* block_table, int32_t layer, int32_t head, float* scratch, float* out);

// AttendOne for `num_queries` queries of one sequence at consecutive positions pos0,
// pos0 + 1, ...: query i is q + i * q_stride and writes out + i * out_stride. Each query's
// result is bit-identical to AttendOne's (the same arithmetic in the same order); walking
// the keys once for all the queries only keeps each K/V block in cache while they read it.
// `scratch` holds at least num_queries * (pos0 + num_queries + 8) floats.
void AttendQueries(const float* q, int64_t q_stride, int32_t num_queries, int32_t pos0,
                   const float* kv, const KvGeometry& g, const int32_t* block_table, int32_t layer,
                   int32_t head, float* scratch, float* out, int64_t out_stride);

// One sequence's queries for AttendChunks: query i (position pos0 + i) is q + i * q_stride,
// its keys come through block_table, its output goes to out + i * out_stride.
struct AttentionChunk {
  const float* q = nullptr;
  int64_t q_stride = 0;
  int32_t num_queries = 0;
  int32_t pos0 = 0;
  const int32_t* block_table = nullptr;
  float* out = nullptr;
  int64_t out_stride = 0;
};

// AttendQueries for several chunks (of different sequences, or of one) and heads
// [first_head, first_head + num_heads) at once, every (query, head) result bit-identical to
// AttendOne's. Each chunk's q and out point at first_head's part of a query row; head
// first_head + h is h * head_dim floats further on. The key blocks are walked by index in the
// outer loop, the chunks inside it and the heads innermost, so a block that several chunks'
// tables share (a common prefix) is read from memory once per (layer, head) and from L1 by
// the rest, and one block's heads, which lie one after another, are read as one run.
// `scratch` holds AttendChunksScratch(chunks, num_heads) floats.
void AttendChunks(absl::Span<const AttentionChunk> chunks, const float* kv, const KvGeometry& g,
                  int32_t layer, int32_t first_head, int32_t num_heads, float* scratch);
int64_t AttendChunksScratch(absl::Span<const AttentionChunk> chunks, int32_t num_heads);

// The heads per task AttendBatch should use: 1 when chunks share K/V blocks (each task then
// reads a shared block once for all its chunks); else as many as leave every thread of the
// pool 4 tasks, so that one task reads each block's heads as one run (bench/attention_bench
// compares the splits; figures in docs/BENCHMARKS.md).
int32_t AttentionHeadsPerTask(int32_t n_head, absl::Span<const AttentionChunk> chunks, int threads);

// Attention of one layer for every chunk (q and out at head 0 of their rows) and every head,
// spread over `pool`: one task per (run of heads_per_task heads, group of chunks) calls
// AttendChunks, so a K/V block that chunks share (a common prefix, or a long prompt's earlier
// blocks) comes from memory once per task and from L1 for the other chunks. Results do not
// depend on heads_per_task or the pool's size.
void AttendBatch(absl::Span<const AttentionChunk> chunks, const float* kv, const KvGeometry& g,
                 int32_t layer, int32_t heads_per_task, ThreadPool* pool);

}  // namespace prefixd

#endif  // PREFIXD_KERNELS_CPU_OPS_H_
