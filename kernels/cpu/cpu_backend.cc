#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "cache/kv_layout.h"
#include "engine/lora_adapter.h"
#include "kernels/cpu/lora_ops.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace prefixd {
namespace {

// Queries per attention task in prefill: they share one walk over the keys, so each K/V block
// is read from memory once per 16 queries instead of once per query (a head's blocks are
// ~1 MB apart in the pool and alias in the caches).
constexpr int64_t kQueryChunk = 16;

// Up to this many rows, layer norms run on the calling thread (no round of the pool).
constexpr int64_t kInlineLayerNormRows = 16;

// Workspace rows start on cache lines (GPT-2's rows are whole lines long): the products'
// tasks store a row's 64-column panels from different threads, and a panel edge inside a line
// would have two cores write, or read-modify-write (the residual adds), one line.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t n) { ::operator delete(p, n * sizeof(T), std::align_val_t{64}); }
  bool operator==(const CacheLineAllocator&) const { return true; }
};
using Workspace = std::vector<float, CacheLineAllocator<float>>;

struct LayerWeights {
  std::vector<float> ln1_g, ln1_b, ln2_g, ln2_b;
  PackedMatrix c_attn, attn_proj, c_fc, mlp_proj;  // [E,3E] [E,E] [E,4E] [4E,E]
  std::vector<float> c_attn_b, attn_proj_b, c_fc_b, mlp_proj_b;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, const CpuBackendOptions& options, int64_t num_blocks, int threads);

  std::string device_name() const override { return "cpu"; }
  // The weights' storage; KV stays fp32 (kv_bytes_per_token).
  DType dtype() const override { return dtype_; }
  // The same bits on every instruction set and thread count (the invariance tests), so one
  // name covers every CPU. kCpuKvNumerics changes with any kernel change that moves a K/V bit
  // (tests/kernels/cpu_backend_test.cc pins the bits it names).
  std::string kv_numerics() const override { return std::string(kCpuKvNumerics); }
  bool computes_all_logits() const override { return true; }
  bool applies_lora() const override { return true; }
  int64_t num_blocks() const override { return num_blocks_; }
  int32_t block_size() const override { return geometry_.block_size; }
  int64_t kv_bytes_per_token() const override {
    return KvBytesPerToken(config_.n_layer, config_.n_head, config_.head_dim(), 4);
  }
  MemoryUsage memory_usage() const override;

 protected:
  StepLimits step_limits() const override { return {config_.n_positions, config_.vocab_size}; }
  absl::Status CheckAdapter(const LoraAdapter& adapter) const override;
  absl::Status RunCopyBlocks(absl::Span<const BlockCopy> copies) override;
  absl::Status RunReadKvBlock(int32_t block, absl::Span<uint8_t> out) override;
  absl::Status RunWriteKvBlock(int32_t block, absl::Span<const uint8_t> data) override;
  absl::Status RunForward(absl::Span<const SequenceStep> steps, std::vector<float>* logits) override;

 private:
  static float* Reserve(Workspace& buffer, int64_t n);
  std::atomic<int64_t> workspace_bytes_{0};  // of the vectors below, kept by Forward
  void RunLayer(int32_t layer, int64_t rows);
  // For every row with an adapter that changes `target` of `layer`:
  // out[r] += its update of in[r] (lora_ops.h). Rows split over the pool, one row per task.
  void AddLoraUpdates(int32_t layer, LoraTarget target, const float* in, int64_t ld_in,
                      float* out, int64_t ld_out);
  // out[r] = LayerNormRow(x[r]) for r in [0, rows), or of x[x_rows[r]] when x_rows is given.
  void LayerNorm(const float* x, int64_t rows, const float* gamma, const float* beta, float* out,
                 const int64_t* x_rows = nullptr);

  ModelConfig config_;
  DType dtype_;
  KvGeometry geometry_;
  int64_t num_blocks_;
  ThreadPool pool_;

  // wte^T packed [E, V]: token t's embedding is its column t (PackedMatrix::CopyColumn), and
  // it is the LM head too unless the file has its own lm_head.weight. One copy of the
  // embeddings, at the weights' dtype (a separate fp32 [V, E] copy cost 154 MB for GPT-2).
  PackedMatrix wte_t_;
  PackedMatrix untied_lm_head_;  // [E, V] = lm_head.weight^T; empty when tied
  const PackedMatrix& lm_head() const {
    return untied_lm_head_.k() != 0 ? untied_lm_head_ : wte_t_;
  }
  std::vector<float> wpe_;  // [P, E]
  std::vector<LayerWeights> layers_;
  std::vector<float> ln_f_g_, ln_f_b_;
  AlignedFloats kv_;

  // Per-step rows (all new tokens of the batch, in step order) and scratch buffers.
  std::vector<int32_t> row_pos_;
  std::vector<const int32_t*> row_table_;
  // Each row's adapter (null: the base), and the rows that have one, in order.
  std::vector<const LoraAdapter*> row_adapter_;
  std::vector<int64_t> lora_rows_;
  int32_t lora_max_rank_ = 0;
  std::vector<float> lora_scratch_;  // rows x kLoraChains x lora_max_rank_ (lora_ops.h)
  // Attention work units: consecutive rows of one step (consecutive positions, one table).
  struct QueryChunk {
    int64_t row;
    int32_t count;
  };
  std::vector<QueryChunk> chunks_;
  std::vector<AttentionChunk> attention_chunks_;
  Workspace x_, h_, qkv_, att_, fc_;
};

CpuBackend::CpuBackend(const Model& model, const CpuBackendOptions& options, int64_t num_blocks,
                       int threads)
    : config_(model.config()), dtype_(options.dtype), num_blocks_(num_blocks), pool_(threads) {
  const int64_t e = config_.n_embd;
  geometry_ = {config_.n_layer, config_.n_head, config_.head_dim(), options.kv_pool.block_size};
  // Every weight as the chosen dtype holds it (exact for f32, and for a checkpoint already
  // in that dtype); the matrices are rounded the same way by Pack.
  auto f = [&](const std::string& name) {
    std::vector<float> w = model.ToFloat(model.Get(name));
    for (float& x : w) x = RoundToDType(x, dtype_);
    return w;
  };
  auto packed = [&](const std::string& name, int64_t k, int64_t n) {
    const std::vector<float> w = model.ToFloat(model.Get(name));
    return PackedMatrix::Pack(w.data(), k, n, /*transposed=*/false, dtype_);
  };
  {
    const std::vector<float> wte = model.ToFloat(model.Get("wte.weight"));
    wte_t_ = PackedMatrix::Pack(wte.data(), e, config_.vocab_size, /*transposed=*/true, dtype_);
  }
  wpe_ = f("wpe.weight");
  layers_.resize(config_.n_layer);
  for (int32_t i = 0; i < config_.n_layer; ++i) {
    const std::string p = absl::StrCat("h.", i, ".");
    LayerWeights& l = layers_[i];
    l.ln1_g = f(p + "ln_1.weight");
    l.ln1_b = f(p + "ln_1.bias");
    l.ln2_g = f(p + "ln_2.weight");
    l.ln2_b = f(p + "ln_2.bias");
    l.c_attn = packed(p + "attn.c_attn.weight", e, 3 * e);
    l.c_attn_b = f(p + "attn.c_attn.bias");
    l.attn_proj = packed(p + "attn.c_proj.weight", e, e);
    l.attn_proj_b = f(p + "attn.c_proj.bias");
    l.c_fc = packed(p + "mlp.c_fc.weight", e, 4 * e);
    l.c_fc_b = f(p + "mlp.c_fc.bias");
    l.mlp_proj = packed(p + "mlp.c_proj.weight", 4 * e, e);
    l.mlp_proj_b = f(p + "mlp.c_proj.bias");
  }
  ln_f_g_ = f("ln_f.weight");
  ln_f_b_ = f("ln_f.bias");
  if (const Tensor* head = model.Find("lm_head.weight"); head != nullptr) {
    const std::vector<float> w = model.ToFloat(*head);
    untied_lm_head_ =
        PackedMatrix::Pack(w.data(), e, config_.vocab_size, /*transposed=*/true, dtype_);
  }
  kv_ = AllocateFloats(static_cast<size_t>(num_blocks_ * geometry_.block_stride()));
}

MemoryUsage CpuBackend::memory_usage() const {
  MemoryUsage u;
  auto vec = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size() * 4); };
  int64_t w = wte_t_.size_bytes() + untied_lm_head_.size_bytes() + vec(wpe_) + vec(ln_f_g_) +
              vec(ln_f_b_);
  for (const LayerWeights& l : layers_) {
    w += vec(l.ln1_g) + vec(l.ln1_b) + vec(l.ln2_g) + vec(l.ln2_b) + vec(l.c_attn_b) +
         vec(l.attn_proj_b) + vec(l.c_fc_b) + vec(l.mlp_proj_b) + l.c_attn.size_bytes() +
         l.attn_proj.size_bytes() + l.c_fc.size_bytes() + l.mlp_proj.size_bytes();
  }
  u.weights_bytes = w;
  u.kv_pool_bytes = num_blocks_ * geometry_.block_stride() * 4;
  u.workspace_bytes = workspace_bytes_.load(std::memory_order_relaxed);
  return u;
}

absl::Status CpuBackend::RunCopyBlocks(absl::Span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) CopyKvRows(kv_.get(), geometry_, c.src, c.dst, c.num_rows);
  return absl::OkStatus();
}

// A block is one contiguous range of the pool in exactly the byte layout the interface
// promises ([n_layer][2][n_head][block_size][head_dim] floats).
absl::Status CpuBackend::RunReadKvBlock(int32_t block, absl::Span<uint8_t> out) {
  std::memcpy(out.data(), kv_.get() + geometry_.Offset(block, 0, 0, 0, 0), out.size());
  return absl::OkStatus();
}

absl::Status CpuBackend::RunWriteKvBlock(int32_t block, absl::Span<const uint8_t> data) {
  std::memcpy(kv_.get() + geometry_.Offset(block, 0, 0, 0, 0), data.data(), data.size());
  return absl::OkStatus();
}

absl::Status CpuBackend::CheckAdapter(const LoraAdapter& adapter) const {
  if (absl::Status fits = CheckLoraAdapterFits(adapter, config_); !fits.ok()) {
    return absl::InvalidArgumentError(fits.message());
  }
  return absl::OkStatus();
}

float* CpuBackend::Reserve(Workspace& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

void CpuBackend::RunLayer(int32_t layer, int64_t rows) {
  const LayerWeights& w = layers_[layer];
  const int64_t e = config_.n_embd;
  const int32_t hd = geometry_.head_dim;
  float* x = x_.data();
  float* h = h_.data();
  float* qkv = qkv_.data();
  float* att = att_.data();
  float* fc = fc_.data();

  LayerNorm(x, rows, w.ln1_g.data(), w.ln1_b.data(), h);
  MatMul(h, rows, e, w.c_attn, w.c_attn_b.data(), qkv, 3 * e, &pool_);
  AddLoraUpdates(layer, LoraTarget::kAttnCAttn, h, e, qkv, 3 * e);
  // K/V of every new token go to their rows first, so each query below reads all of its
  // keys, cached or new, the same way.
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t pos = row_pos_[r];
    const int32_t block = row_table_[r][pos / geometry_.block_size];
    const int32_t slot = pos % geometry_.block_size;
    for (int32_t head = 0; head < geometry_.n_head; ++head) {
      std::memcpy(kv_.get() + geometry_.Offset(block, layer, 0, head, slot),
                  qkv + r * 3 * e + e + head * hd, sizeof(float) * hd);
      std::memcpy(kv_.get() + geometry_.Offset(block, layer, 1, head, slot),
                  qkv + r * 3 * e + 2 * e + head * hd, sizeof(float) * hd);
    }
  }
  // Every chunk's queries and outputs, at head 0 of their rows.
  attention_chunks_.clear();
  for (const QueryChunk& c : chunks_) {
    attention_chunks_.push_back({qkv + c.row * 3 * e, 3 * e, c.count, row_pos_[c.row],
                                 row_table_[c.row], att + c.row * e, e});
  }
  AttendBatch(attention_chunks_, kv_.get(), geometry_, layer,
              AttentionHeadsPerTask(geometry_.n_head, attention_chunks_, pool_.num_threads()),
              &pool_);
  // The residual connections and gelu are applied by the products as they store. An
  // adapter's update of a projection is added to the residual after the product's own
  // (x + y, then + the update: a fixed order for the row, whatever its batch mates).
  MatMul(att, rows, e, w.attn_proj, w.attn_proj_b.data(), x, e, &pool_, MatMulOutput::kAddTo);
  AddLoraUpdates(layer, LoraTarget::kAttnCProj, att, e, x, e);
  LayerNorm(x, rows, w.ln2_g.data(), w.ln2_b.data(), h);
  if (lora_rows_.empty()) {
    MatMul(h, rows, e, w.c_fc, w.c_fc_b.data(), fc, 4 * e, &pool_, MatMulOutput::kGelu);
  } else {
    // gelu must see the update, so it runs after it: the product stores, then gelu runs per
    // row, which for a row without an adapter is the fused kGelu's bits (matmul.h).
    MatMul(h, rows, e, w.c_fc, w.c_fc_b.data(), fc, 4 * e, &pool_, MatMulOutput::kStore);
    // One round: each row's update (when it has one), then its gelu.
    pool_.Run(rows, [&](int64_t r) {
      float* row = fc + r * 4 * e;
      if (const LoraAdapter* a = row_adapter_[r]; a != nullptr) {
        if (const LoraModule* m = a->module(layer, LoraTarget::kMlpCFc); m != nullptr) {
          AddLoraUpdateRow(*m, a->rank, a->scaling, h + r * e, row,
                           lora_scratch_.data() + r * kLoraChains * lora_max_rank_);
        }
      }
      GeluNewInPlace(row, 4 * e);
    });
  }
  MatMul(fc, rows, 4 * e, w.mlp_proj, w.mlp_proj_b.data(), x, e, &pool_, MatMulOutput::kAddTo);
  AddLoraUpdates(layer, LoraTarget::kMlpCProj, fc, 4 * e, x, e);
}

void CpuBackend::AddLoraUpdates(int32_t layer, LoraTarget target, const float* in, int64_t ld_in,
                                float* out, int64_t ld_out) {
  if (lora_rows_.empty()) return;
  pool_.Run(static_cast<int64_t>(lora_rows_.size()), [&](int64_t i) {
    const int64_t r = lora_rows_[i];
    const LoraAdapter& adapter = *row_adapter_[r];
    const LoraModule* m = adapter.module(layer, target);
    if (m == nullptr) return;
    AddLoraUpdateRow(*m, adapter.rank, adapter.scaling, in + r * ld_in, out + r * ld_out,
                     lora_scratch_.data() + r * kLoraChains * lora_max_rank_);
  });
}

void CpuBackend::LayerNorm(const float* x, int64_t rows, const float* gamma, const float* beta,
                           float* out, const int64_t* x_rows) {
  const int64_t e = config_.n_embd;
  const float eps = config_.layer_norm_epsilon;
  auto row = [&](int64_t r) {
    LayerNormRow(x + (x_rows != nullptr ? x_rows[r] : r) * e, e, gamma, beta, eps, out + r * e);
  };
  // A decode step's few rows take a couple of microseconds: less than a round of the pool.
  if (rows <= kInlineLayerNormRows) {
    for (int64_t r = 0; r < rows; ++r) row(r);
  } else {
    pool_.Run(rows, row);
  }
}

absl::Status CpuBackend::RunForward(absl::Span<const SequenceStep> steps,
                                   std::vector<float>* logits) {
  const int64_t e = config_.n_embd;
  int64_t rows = 0;
  for (const SequenceStep& step : steps) rows += static_cast<int64_t>(step.token_ids.size());
  if (rows == 0) return absl::OkStatus();
  row_pos_.resize(rows);
  row_table_.resize(rows);
  row_adapter_.resize(rows);
  lora_rows_.clear();
  lora_max_rank_ = 0;
  float* x = Reserve(x_, rows * e);
  Reserve(h_, rows * e);
  Reserve(qkv_, rows * 3 * e);
  Reserve(att_, rows * e);
  Reserve(fc_, rows * 4 * e);
  // For memory_usage(), which a metrics scrape calls on its own thread: the vectors' sizes
  // themselves are this thread's alone.
  auto bytes = [](const Workspace& v) { return static_cast<int64_t>(v.size() * 4); };
  workspace_bytes_.store(bytes(x_) + bytes(h_) + bytes(qkv_) + bytes(att_) + bytes(fc_),
                         std::memory_order_relaxed);

  std::vector<int64_t> logit_rows;
  chunks_.clear();
  int64_t r = 0;
  for (const SequenceStep& step : steps) {
    const int64_t count = static_cast<int64_t>(step.token_ids.size());
    for (int64_t i = 0; i < count; i += kQueryChunk) {
      chunks_.push_back({r + i, static_cast<int32_t>(std::min(kQueryChunk, count - i))});
    }
    for (size_t i = 0; i < step.token_ids.size(); ++i, ++r) {
      const int32_t pos = step.start_pos + static_cast<int32_t>(i);
      row_pos_[r] = pos;
      row_table_[r] = step.block_table.data();
      row_adapter_[r] = step.adapter;
      if (step.adapter != nullptr) {
        lora_rows_.push_back(r);
        lora_max_rank_ = std::max(lora_max_rank_, step.adapter->rank);
      }
      float* row = x + r * e;
      wte_t_.CopyColumn(step.token_ids[i], row);
      const float* pe = wpe_.data() + int64_t{pos} * e;
      for (int64_t j = 0; j < e; ++j) row[j] += pe[j];
    }
    if (step.want_all_logits) {
      // Every row's logits: the final layer norm and the LM head are per row, so each is the
      // same bits as when that row is a step's last.
      for (int64_t i = r - count; i < r; ++i) logit_rows.push_back(i);
    } else if (step.want_logits) {
      logit_rows.push_back(r - 1);
    }
  }
  // Scratch per row of the batch (not per adapter row): the fused c_fc pass indexes by row.
  lora_scratch_.resize(lora_rows_.empty() ? 0
                                          : static_cast<size_t>(rows) * kLoraChains *
                                                static_cast<size_t>(lora_max_rank_));
  for (int32_t l = 0; l < config_.n_layer; ++l) RunLayer(l, rows);
  if (logit_rows.empty()) return absl::OkStatus();

  const int64_t n_out = static_cast<int64_t>(logit_rows.size());
  float* h = h_.data();  // rows >= n_out, so h_ has room
  LayerNorm(x, n_out, ln_f_g_.data(), ln_f_b_.data(), h, logit_rows.data());
  const int64_t v = config_.vocab_size;
  const size_t old_size = logits->size();
  logits->resize(old_size + n_out * v);
  MatMul(h, n_out, e, lm_head(), nullptr, logits->data() + old_size, v, &pool_);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options) {
  if (options.model == nullptr) return absl::InvalidArgumentError("CPU backend: no model");
  if (absl::Status s = ValidateKvPoolOptions(options.kv_pool); !s.ok()) return s;
  if (options.threads < 0 || options.threads > kMaxCpuBackendThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be 0 (all cores) or 1 to ",
                                                   kMaxCpuBackendThreads, ", got ",
                                                   options.threads));
  }
  const ModelConfig& c = options.model->config();
  const int64_t per_token = KvBytesPerToken(c.n_layer, c.n_head, c.head_dim(), 4);
  const int32_t bs = options.kv_pool.block_size;
  const int64_t num_blocks = KvBlocksForBudget(options.kv_pool.budget_bytes, bs, per_token);
  if (num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPU backend: a KV budget of ", options.kv_pool.budget_bytes, " bytes holds no block of ",
        bs, " tokens (", bs * per_token, " bytes each)"));
  }
  int threads = options.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return std::unique_ptr<Backend>(new CpuBackend(*options.model, options, num_blocks, threads));
}

}  // namespace prefixd
