// The CUDA backend's start-up (weights, activation buffers, the KV pool), forward pass, CUDA
// graphs and CreateCudaBackend. The class and its invariants are in cuda_backend_impl.h; LoRA
// adapters are in cuda_backend_lora.cc, block copies and K/V block transfers in
// cuda_backend_kv.cc.
//
// Per pass of T tokens (EnqueueForward), all on one stream:
//
//   x[T,E] fp32 = wte[tok] + wpe[pos]                                 embedding
//   per layer l:
//     h = LN1(x += pending bias of layer l-1's mlp.c_proj)             layernorm (fused)
//     qkv[T,3E] fp32 = h . c_attn          (cuBLAS, fp32 accumulate)
//     qkv += c_attn.bias; K, V -> pool slots                           kv_write
//     h = softmax(q K^T / sqrt(hd)) V over [0, pos] of each token       attention (+ merge)
//     x += h . attn.c_proj                 (cuBLAS, beta = 1)
//     h = LN2(x += attn.c_proj.bias)                                    layernorm (fused)
//     f[T,I] fp32 = h . c_fc;  u = gelu_new(f + c_fc.bias)              gelu
//     x += u . mlp.c_proj                  (cuBLAS, beta = 1)
//     (with adapters in the pass, each of the four products is followed by its rows' LoRA
//      updates, y += scaling . (in . A^T) . B^T, before anything reads y: lora_update)
//   y[R,E] = LN_f(x[rows] += last mlp.c_proj.bias); logits[R,V] = y . lm_head^T
//
// The residual stream stays fp32 whatever the dtype; GEMM inputs and the KV pool are in
// the dtype. Host metadata (tokens, positions, slots, block tables, logit rows) is packed
// into one pinned buffer and uploaded with one copy per pass; with adapters, the per-row
// LoRA table (lora_update.cuh) is a second pinned buffer and copy.
//
// LoRA adapters (cuda_backend_lora.cc): a Forward() first makes the device copy of each of its
// adapters resident. Decode graphs are keyed by (bucket, attention splits, has adapters): the
// LoRA launches read their rows' adapters from the table uploaded before each replay, so one
// graph serves every mix of adapters and ranks.
#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "engine/dtype.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/kv_budget.h"
#include "kernels/cuda/kv_pool_layout.h"
#include "kernels/cuda/kv_write.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/lora_plan.h"
#include "kernels/cuda/step_plan.h"

namespace prefixd::cuda {
namespace {

// The largest decode batch replayed as a graph; bigger decode steps run eagerly (launch
// overhead is negligible next to their work).
constexpr int32_t kMaxGraphBatch = 256;
// cuBLAS needs a fixed workspace to be capturable in a graph; 32 MiB is what NVIDIA
// recommends for Hopper.
constexpr size_t kCublasWorkspaceBytes = 32u << 20;
// Sub-allocations of the weight arena start at 256 B boundaries (cuBLAS and vector loads
// prefer aligned operands).
constexpr size_t kAlign = 256;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

cudaDataType CudaType(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kI8:  // refused by CreateCudaBackend
      break;
  }
  return CUDA_R_32F;
}

}  // namespace

CudaBackend::~CudaBackend() {
  // Best effort: errors here cannot be reported, and a broken context frees everything anyway.
  cudaSetDevice(options_.device);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (auto& [key, exec] : graphs_) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  for (auto& [digest, a] : device_adapters_) cudaFree(a.arena);
  for (void* p : device_allocs_) cudaFree(p);
  for (void* p : host_allocs_) cudaFreeHost(p);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::Fail(absl::Status status) {
  if (IsFatalDeviceError(status) && broken_.ok()) broken_ = status;
  return status;
}

absl::Status CudaBackend::Malloc(size_t bytes, void** ptr) {
  if (absl::Status s = cuda::DeviceAlloc(bytes, ptr); !s.ok()) return s;
  device_allocs_.push_back(*ptr);
  return absl::OkStatus();
}

absl::Status CudaBackend::Init() {
  const int32_t E = config_.n_embd;
  // A failure this thread handled before (and did not clear) must not be reported by our
  // first launch check as that launch's own.
  cudaGetLastError();
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PREFIXD_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  PREFIXD_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  // Scalars (alpha, beta) are host values, baked into a captured graph by value.
  PREFIXD_CUBLAS_RETURN_IF_ERROR(cublasSetPointerMode(cublas_, CUBLAS_POINTER_MODE_HOST));
  void* workspace = nullptr;
  if (absl::Status s = Malloc(kCublasWorkspaceBytes, &workspace); !s.ok()) return s;
  PREFIXD_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(cublas_, workspace, kCublasWorkspaceBytes));
  usage_.workspace_bytes += kCublasWorkspaceBytes;
  PREFIXD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options_.device));
  int cc_major = 0, cc_minor = 0, cublas_version = 0;
  PREFIXD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, options_.device));
  PREFIXD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, options_.device));
  PREFIXD_CUBLAS_RETURN_IF_ERROR(cublasGetVersion(cublas_, &cublas_version));
  kv_numerics_ = absl::StrCat("cuda r1 sm_", cc_major, cc_minor, " cublas ", cublas_version,
                              CudaDeviceIsInterpreted() ? " interpreted" : "");

  n_inner_ = static_cast<int32_t>(options_.model->Get("h.0.mlp.c_fc.weight").shape[1]);
  const int32_t bs = options_.kv_pool.block_size;
  max_blocks_per_seq_ = (config_.n_positions + bs - 1) / bs;
  layout_ = {config_.n_layer, config_.n_head, bs, config_.head_dim()};

  if (absl::Status s = UploadWeights(); !s.ok()) return s;

  // Activation buffers.
  token_cap_ = options_.max_step_tokens;
  row_cap_ = options_.max_logit_rows;
  const int64_t T = token_cap_, R = row_cap_, V = config_.vocab_size;
  const int64_t elt = DTypeSize(options_.dtype);
  const int64_t scratch_width = std::max<int64_t>(3 * E, n_inner_);
  const int64_t meta_ints = MetaLayout(T, R, T, max_blocks_per_seq_).total;
  // AttentionSplits only splits while tokens x heads x splits < 4 x SMs, so a split pass
  // never has more than 8 x SMs (token, head, split) triples.
  partial_floats_ = int64_t{8} * num_sms_ * (config_.head_dim() + 2);
  struct {
    void** ptr;
    int64_t bytes;
  } buffers[] = {
      {reinterpret_cast<void**>(&x_), T * E * 4},
      {&h_, T * E * elt},
      {reinterpret_cast<void**>(&scratch_), T * scratch_width * 4},
      {&u_, T * n_inner_ * elt},
      {&final_h_, R * E * elt},
      {reinterpret_cast<void**>(&d_logits_), R * V * 4},
      {reinterpret_cast<void**>(&d_meta_), meta_ints * 4},
      {reinterpret_cast<void**>(&d_copies_), int64_t{kMaxCopiesPerLaunch} * 3 * 4},
      {reinterpret_cast<void**>(&partials_), partial_floats_ * 4},
      {reinterpret_cast<void**>(&d_lora_rows_),
       T * static_cast<int64_t>(sizeof(cuda::LoraRowDevice))},
  };
  for (auto& b : buffers) {
    if (absl::Status s = Malloc(b.bytes, b.ptr); !s.ok()) return s;
    usage_.workspace_bytes += b.bytes;
  }
  for (auto [ptr, bytes] :
       {std::pair{reinterpret_cast<void**>(&h_meta_), meta_ints * 4},
        std::pair{reinterpret_cast<void**>(&h_logits_), R * V * 4},
        std::pair{reinterpret_cast<void**>(&h_copies_), int64_t{kMaxCopiesPerLaunch} * 3 * 4},
        std::pair{reinterpret_cast<void**>(&h_lora_rows_),
                  T * static_cast<int64_t>(sizeof(cuda::LoraRowDevice))}}) {
    if (absl::Status s = cuda::PinnedAlloc(bytes, ptr); !s.ok()) return s;
    host_allocs_.push_back(*ptr);
  }

  // The KV pool, last, so that "a fraction of free memory" means what is left after the rest.
  size_t free_bytes = 0, total_bytes = 0;
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  cuda::KvPoolRequest request;
  request.budget_bytes = options_.kv_pool.budget_bytes;
  request.fraction = options_.kv_cache_fraction;
  // The adapters' device copies are allocated on first use, after the pool: their cap stays
  // out of what the pool may take.
  request.free_bytes =
      std::max<int64_t>(static_cast<int64_t>(free_bytes) - options_.adapter_cache_bytes, 0);
  request.block_bytes = layout_.block_elems() * elt;
  request.block_size = options_.kv_pool.block_size;
  absl::StatusOr<cuda::KvPoolPlan> plan = cuda::PlanKvPool(request);
  if (!plan.ok()) return plan.status();
  num_blocks_ = plan->num_blocks;
  if (absl::Status s = Malloc(plan->pool_bytes, &kv_pool_); !s.ok()) return s;
  // Zeroed so that a bug reading an unwritten row shows as wrong numbers, not as NaN noise
  // that differs run to run.
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_pool_, 0, plan->pool_bytes, stream_));
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  usage_.kv_pool_bytes = plan->pool_bytes;
  return absl::OkStatus();
}

absl::Status CudaBackend::UploadTensor(std::string_view name, const void** out, char** arena) {
  const Tensor& t = options_.model->Get(name);
  const std::vector<float> f = options_.model->ToFloat(t);
  const int64_t n = static_cast<int64_t>(f.size());
  std::vector<uint16_t> half;
  const void* src = f.data();
  size_t bytes = n * sizeof(float);
  if (options_.dtype != DType::kF32) {
    half.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      half[i] = options_.dtype == DType::kF16 ? FloatToHalf(f[i]) : FloatToBF16(f[i]);
    }
    src = half.data();
    bytes = n * sizeof(uint16_t);
  }
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaMemcpy(*arena, src, bytes, cudaMemcpyHostToDevice));
  *out = *arena;
  *arena += AlignUp(bytes);
  return absl::OkStatus();
}

absl::Status CudaBackend::UploadWeights() {
  std::vector<std::pair<std::string, const void**>> names;
  names.push_back({"wte.weight", &wte_});
  names.push_back({"wpe.weight", &wpe_});
  names.push_back({"ln_f.weight", &lnf_g_});
  names.push_back({"ln_f.bias", &lnf_b_});
  const bool has_lm_head = options_.model->Find("lm_head.weight") != nullptr;
  if (has_lm_head) names.push_back({"lm_head.weight", &lm_head_});
  layers_.resize(config_.n_layer);
  for (int32_t i = 0; i < config_.n_layer; ++i) {
    LayerWeights& w = layers_[i];
    const std::string p = absl::StrCat("h.", i, ".");
    for (auto [suffix, ptr] : std::initializer_list<std::pair<const char*, const void**>>{
             {"ln_1.weight", &w.ln1_g},
             {"ln_1.bias", &w.ln1_b},
             {"attn.c_attn.weight", &w.qkv_w},
             {"attn.c_attn.bias", &w.qkv_b},
             {"attn.c_proj.weight", &w.proj_w},
             {"attn.c_proj.bias", &w.proj_b},
             {"ln_2.weight", &w.ln2_g},
             {"ln_2.bias", &w.ln2_b},
             {"mlp.c_fc.weight", &w.fc_w},
             {"mlp.c_fc.bias", &w.fc_b},
             {"mlp.c_proj.weight", &w.fc2_w},
             {"mlp.c_proj.bias", &w.fc2_b}}) {
      names.push_back({p + suffix, ptr});
    }
  }
  size_t total = 0;
  for (const auto& [name, ptr] : names) {
    total += AlignUp(options_.model->Get(name).numel() * DTypeSize(options_.dtype));
  }
  void* arena_base = nullptr;
  if (absl::Status s = Malloc(total, &arena_base); !s.ok()) return s;
  usage_.weights_bytes = static_cast<int64_t>(total);
  char* arena = static_cast<char*>(arena_base);
  for (const auto& [name, ptr] : names) {
    if (absl::Status s = UploadTensor(name, ptr, &arena); !s.ok()) return s;
  }
  if (!has_lm_head) lm_head_ = wte_;
  // cudaMemcpy from pageable memory may return before its DMA lands, and stream_ does not
  // synchronise with the legacy default stream: wait here, once.
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status CudaBackend::Gemm(int32_t rows, int32_t k, int32_t n, const void* x, const void* w,
                               bool w_transposed, float beta, float* y) {
  // Row-major y[rows, n] = x[rows, k] . W (+ beta * y), W stored [k, n] (HF Conv1D) or, when
  // w_transposed, [n, k] (lm_head). cuBLAS is column-major, so compute y^T = W^T . x^T:
  // a row-major [a, b] matrix is a column-major [b, a] one with leading dimension b.
  const float alpha = 1.0f;
  const cudaDataType type = CudaType(options_.dtype);
  // fp32 accumulation for every dtype (CUBLAS_COMPUTE_32F: no TF32 for fp32 either, which
  // the 1e-3 parity bound against the CPU backend needs).
  PREFIXD_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(cublas_, w_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, rows, k,
                   &alpha, w, type, w_transposed ? k : n, x, type, k, &beta, y, CUDA_R_32F, n,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status CudaBackend::EnqueueForward(const PassMeta& m) {
  const DType dt = options_.dtype;
  const int32_t E = config_.n_embd, T = m.num_tokens;
  PREFIXD_CHECK(cuda::AttentionPartialFloats(T, config_.n_head, config_.head_dim(),
                                             m.attention_splits) <= partial_floats_);
  PREFIXD_CUDA_RETURN_IF_ERROR(
      cuda::LaunchEmbedding(dt, wte_, wpe_, m.tokens, m.positions, T, E, x_, stream_));
  for (int32_t l = 0; l < config_.n_layer; ++l) {
    const LayerWeights& w = layers_[l];
    cuda::LayerNormArgs ln1;
    ln1.x = x_;
    ln1.residual_bias = l > 0 ? layers_[l - 1].fc2_b : nullptr;
    ln1.gamma = w.ln1_g;
    ln1.beta = w.ln1_b;
    ln1.out = h_;
    ln1.num_rows = T;
    ln1.n_embd = E;
    ln1.eps = config_.layer_norm_epsilon;
    PREFIXD_CUDA_RETURN_IF_ERROR(cuda::LaunchLayerNorm(dt, ln1, stream_));
    if (absl::Status s = Gemm(T, E, 3 * E, h_, w.qkv_w, false, 0.0f, scratch_); !s.ok()) {
      return s;
    }
    if (absl::Status s = LoraUpdate(m, l, LoraTarget::kAttnCAttn, h_, E, scratch_, 3 * E);
        !s.ok()) {
      return s;
    }
    cuda::KvWriteArgs kvw;
    kvw.qkv = scratch_;
    kvw.bias = w.qkv_b;
    kvw.slots = m.slots;
    kvw.kv_pool = kv_pool_;
    kvw.layout = layout_;
    kvw.layer = l;
    kvw.num_tokens = T;
    PREFIXD_CUDA_RETURN_IF_ERROR(cuda::LaunchKvWrite(dt, kvw, stream_));
    cuda::AttentionArgs at;
    at.qkv = scratch_;
    at.kv_pool = kv_pool_;
    at.layout = layout_;
    at.layer = l;
    at.positions = m.positions;
    at.token_seq = m.token_seq;
    at.block_tables = m.tables;
    at.max_blocks_per_seq = max_blocks_per_seq_;
    at.num_tokens = T;
    at.num_splits = m.attention_splits;
    at.partials = partials_;
    at.out = h_;
    PREFIXD_CUDA_RETURN_IF_ERROR(cuda::LaunchPagedAttention(dt, at, stream_));
    // beta = 1: the projection lands on the residual stream directly; its bias is added by
    // the next LayerNorm (residual_bias), which reads the row anyway.
    if (absl::Status s = Gemm(T, E, E, h_, w.proj_w, false, 1.0f, x_); !s.ok()) return s;
    if (absl::Status s = LoraUpdate(m, l, LoraTarget::kAttnCProj, h_, E, x_, E); !s.ok()) {
      return s;
    }
    cuda::LayerNormArgs ln2 = ln1;
    ln2.residual_bias = w.proj_b;
    ln2.gamma = w.ln2_g;
    ln2.beta = w.ln2_b;
    PREFIXD_CUDA_RETURN_IF_ERROR(cuda::LaunchLayerNorm(dt, ln2, stream_));
    if (absl::Status s = Gemm(T, E, n_inner_, h_, w.fc_w, false, 0.0f, scratch_); !s.ok()) {
      return s;
    }
    // Before gelu, which must see the update.
    if (absl::Status s = LoraUpdate(m, l, LoraTarget::kMlpCFc, h_, E, scratch_, n_inner_);
        !s.ok()) {
      return s;
    }
    PREFIXD_CUDA_RETURN_IF_ERROR(
        cuda::LaunchBiasGelu(dt, scratch_, w.fc_b, T, n_inner_, u_, stream_));
    if (absl::Status s = Gemm(T, n_inner_, E, u_, w.fc2_w, false, 1.0f, x_); !s.ok()) return s;
    if (absl::Status s = LoraUpdate(m, l, LoraTarget::kMlpCProj, u_, n_inner_, x_, E); !s.ok()) {
      return s;
    }
  }
  if (m.num_rows == 0) return absl::OkStatus();
  cuda::LayerNormArgs lnf;
  lnf.x = x_;
  lnf.row_index = m.rows;
  lnf.residual_bias = layers_.back().fc2_b;
  lnf.gamma = lnf_g_;
  lnf.beta = lnf_b_;
  lnf.out = final_h_;
  lnf.num_rows = m.num_rows;
  lnf.n_embd = E;
  lnf.eps = config_.layer_norm_epsilon;
  PREFIXD_CUDA_RETURN_IF_ERROR(cuda::LaunchLayerNorm(dt, lnf, stream_));
  return Gemm(m.num_rows, E, config_.vocab_size, final_h_, lm_head_, true, 0.0f, d_logits_);
}

PassMeta CudaBackend::WriteMeta(absl::Span<const SequenceStep> steps,
                                absl::Span<const StepPiece> pieces, int32_t token_cap,
                                int32_t row_cap, int32_t num_tokens, int32_t num_rows) {
  const int32_t seq_cap = token_cap;
  const MetaLayout L(token_cap, row_cap, seq_cap, max_blocks_per_seq_);
  const int32_t bs = options_.kv_pool.block_size;
  int32_t t = 0, r = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const StepPiece& piece = pieces[p];
    const SequenceStep& s = steps[piece.step];
    for (int32_t i = 0; i < piece.length; ++i, ++t) {
      const int32_t pos = s.start_pos + piece.begin + i;
      h_meta_[L.tokens + t] = static_cast<int32_t>(s.token_ids[piece.begin + i]);
      h_meta_[L.positions + t] = pos;
      h_meta_[L.slots + t] = s.block_table[pos / bs] * bs + pos % bs;
      h_meta_[L.token_seq + t] = static_cast<int32_t>(p);
      if (piece.all_logits) h_meta_[L.rows + r++] = t;
    }
    if (piece.logits) h_meta_[L.rows + r++] = t - 1;
    const int32_t blocks = (s.start_pos + piece.begin + piece.length + bs - 1) / bs;
    std::memcpy(h_meta_ + L.tables + p * max_blocks_per_seq_, s.block_table.data(),
                blocks * sizeof(int32_t));
  }
  // Padding (graph batches only): a token at position 0 of its own one-block table that
  // points to the scratch block, so it writes and reads only scratch K/V.
  const int32_t scratch = static_cast<int32_t>(num_blocks_);
  for (int32_t p = static_cast<int32_t>(pieces.size()); t < num_tokens; ++t, ++p) {
    h_meta_[L.tokens + t] = 0;
    h_meta_[L.positions + t] = 0;
    h_meta_[L.slots + t] = scratch * bs;
    h_meta_[L.token_seq + t] = p;
    h_meta_[L.tables + p * max_blocks_per_seq_] = scratch;
  }
  for (; r < num_rows; ++r) h_meta_[L.rows + r] = r;
  PassMeta m;
  m.num_tokens = num_tokens;
  m.num_rows = num_rows;
  m.tokens = d_meta_ + L.tokens;
  m.positions = d_meta_ + L.positions;
  m.slots = d_meta_ + L.slots;
  m.token_seq = d_meta_ + L.token_seq;
  m.rows = d_meta_ + L.rows;
  m.tables = d_meta_ + L.tables;
  return m;
}

absl::Status CudaBackend::UploadMeta(int64_t ints) {
  PREFIXD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_meta_, h_meta_, ints * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyLogitsOut(int32_t num_rows, absl::Span<const int32_t> append,
                                        std::vector<float>* logits) {
  const int64_t V = config_.vocab_size;
  if (num_rows > 0) {
    PREFIXD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(h_logits_, d_logits_, num_rows * V * 4, cudaMemcpyDeviceToHost, stream_));
  }
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  logits->reserve(logits->size() + append.size() * V);
  for (int32_t r : append)
    logits->insert(logits->end(), h_logits_ + r * V, h_logits_ + (r + 1) * V);
  return absl::OkStatus();
}

absl::Status CudaBackend::RunEager(absl::Span<const SequenceStep> steps,
                                   absl::Span<const StepPiece> pieces, std::vector<float>* logits) {
  int32_t tokens = 0, rows = 0, max_keys = 0;
  for (const StepPiece& p : pieces) {
    tokens += p.length;
    rows += p.all_logits ? p.length : p.logits ? 1 : 0;
    max_keys = std::max(max_keys, steps[p.step].start_pos + p.begin + p.length);
  }
  PassMeta meta = WriteMeta(steps, pieces, tokens, rows, tokens, rows);
  meta.attention_splits = cuda::AttentionSplits(tokens, config_.n_head, max_keys, num_sms_);
  const MetaLayout L(tokens, rows, tokens, max_blocks_per_seq_);
  const int64_t ints = L.tables + static_cast<int64_t>(pieces.size()) * max_blocks_per_seq_;
  if (absl::Status s = UploadMeta(ints); !s.ok()) return s;
  if (absl::Status s = UploadLoraRows(cuda::PlanLoraPass(steps, pieces, tokens), &meta); !s.ok()) {
    return s;
  }
  if (absl::Status s = EnqueueForward(meta); !s.ok()) return s;
  // Only the wanted rows were computed, in piece order (every token of an all_logits piece).
  std::vector<int32_t> append(rows);
  std::iota(append.begin(), append.end(), 0);
  return CopyLogitsOut(rows, append, logits);
}

absl::Status CudaBackend::RunGraph(absl::Span<const SequenceStep> steps,
                                   std::vector<float>* logits) {
  const int32_t n = static_cast<int32_t>(steps.size());
  int32_t bucket = 1;
  while (bucket < n) bucket *= 2;
  // The graph runs `bucket` tokens and logit rows: Forward only sends batches whose bucket
  // fits the buffers (MaxGraphBatch).
  PREFIXD_CHECK(bucket <= token_cap_ && bucket <= row_cap_);
  std::vector<StepPiece> pieces(n);
  int32_t max_keys = 0;
  for (int32_t i = 0; i < n; ++i) {
    pieces[i] = {i, 0, 1, true};
    max_keys = std::max(max_keys, steps[i].start_pos + 1);
  }
  PassMeta meta = WriteMeta(steps, pieces, bucket, bucket, bucket, bucket);
  meta.attention_splits = cuda::AttentionSplits(bucket, config_.n_head, max_keys, num_sms_);
  const MetaLayout L(bucket, bucket, bucket, max_blocks_per_seq_);
  // The LoRA table goes up first: a replay reads it like d_meta_ (padding rows have none).
  if (absl::Status s = UploadLoraRows(cuda::PlanLoraPass(steps, pieces, bucket), &meta); !s.ok()) {
    return s;
  }
  const std::tuple<int32_t, int32_t, bool> key = {bucket, meta.attention_splits,
                                                  meta.lora_rows != nullptr};
  // Every row's logits are computed; only rows up to the last wanted one travel to the host.
  std::vector<int32_t> append;
  for (int32_t i = 0; i < n; ++i) {
    if (steps[i].want_logits || steps[i].want_all_logits) append.push_back(i);
  }
  const int32_t copy_rows = append.empty() ? 0 : append.back() + 1;
  auto it = graphs_.find(key);
  if (it == graphs_.end() || it->second == nullptr) {
    // First step of this shape, or a shape whose capture failed: run it eagerly (which also
    // loads every kernel and cuBLAS module, so nothing is lazily loaded during a capture).
    if (absl::Status s = UploadMeta(L.total); !s.ok()) return s;
    if (absl::Status s = EnqueueForward(meta); !s.ok()) return s;
    if (absl::Status s = CopyLogitsOut(copy_rows, append, logits); !s.ok()) return s;
    if (it != graphs_.end()) return absl::OkStatus();
    // Then capture the same sequence of launches for the steps after it.
    cudaGraphExec_t exec = nullptr;
    if (absl::Status s = CaptureGraph(meta, &exec); !s.ok()) return s;
    graphs_.emplace(key, exec);
    return absl::OkStatus();
  }
  if (absl::Status s = UploadMeta(L.total); !s.ok()) return s;
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_));
  return CopyLogitsOut(copy_rows, append, logits);
}

absl::Status CudaBackend::CaptureGraph(const PassMeta& meta, cudaGraphExec_t* exec) {
  *exec = nullptr;
  // Capture executes nothing. `status` is the first failure; `failure` the CUDA error that
  // AfterGraphFailure judges (cudaSuccess where only cuBLAS failed).
  cudaError_t failure = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  absl::Status status =
      failure == cudaSuccess
          ? absl::OkStatus()
          : cuda::CudaErrorStatus(failure, "cudaStreamBeginCapture", __FILE__, __LINE__);
  if (failure == cudaSuccess) {
    status = EnqueueForward(meta);
    // End the capture even after a failed enqueue so the stream leaves capture mode.
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (status.ok() && ended != cudaSuccess) {
      status = cuda::CudaErrorStatus(ended, "cudaStreamEndCapture", __FILE__, __LINE__);
    }
    // A failed enqueue invalidates the capture: EndCapture's error is the CUDA one to judge.
    failure = ended;
    if (status.ok()) {
      const bool fault = options_.graph_instantiation_fault && options_.graph_instantiation_fault();
      failure = fault ? cudaErrorNotSupported : cudaGraphInstantiate(exec, graph, 0);
      if (failure != cudaSuccess) {
        *exec = nullptr;
        status = cuda::CudaErrorStatus(failure, "cudaGraphInstantiate", __FILE__, __LINE__);
      }
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  if (status.ok()) return status;
  // The eager run of this step just succeeded; unless the context is broken, the shape keeps
  // running eagerly. Clear the handled error first so the next launch does not report it.
  cudaGetLastError();
  const cudaError_t health = cudaStreamSynchronize(stream_);
  if (cuda::AfterGraphFailure(failure, health) == cuda::GraphFailureAction::kFatal) {
    return health != cudaSuccess
               ? cuda::CudaErrorStatus(health, "cudaStreamSynchronize after a failed capture",
                                       __FILE__, __LINE__)
               : status;
  }
  const int64_t fallbacks = graph_fallbacks_.fetch_add(1, std::memory_order_relaxed) + 1;
  std::fprintf(stderr,
               "prefixd: cuda: no CUDA graph for decode batches of %d (%d attention splits), "
               "they run eagerly (graph fallbacks: %lld): %s\n",
               meta.num_tokens, meta.attention_splits, static_cast<long long>(fallbacks),
               std::string(status.message()).c_str());
  return absl::OkStatus();
}

absl::Status CudaBackend::RunForward(absl::Span<const SequenceStep> steps,
                                     std::vector<float>* logits) {
  if (!broken_.ok()) return broken_;
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
    return Fail(cuda::CudaErrorStatus(e, "cudaSetDevice", __FILE__, __LINE__));
  }
  if (absl::Status s = MakeAdaptersResident(steps); !s.ok()) return Fail(s);
  const bool all_decode = std::all_of(
      steps.begin(), steps.end(), [](const SequenceStep& s) { return s.token_ids.size() == 1; });
  // Graph batches are padded to a power of two (RunGraph), which must fit the token and row
  // buffers: the largest power of two within the caps (a cap of 100 allows batches of 64).
  int32_t max_graph = 1;
  while (max_graph * 2 <= std::min({kMaxGraphBatch, token_cap_, row_cap_})) max_graph *= 2;
  if (options_.use_cuda_graphs && all_decode && static_cast<int32_t>(steps.size()) <= max_graph) {
    const size_t before = logits->size();
    absl::Status s = RunGraph(steps, logits);
    if (!s.ok()) logits->resize(before);
    return s.ok() ? s : Fail(s);
  }
  const std::vector<std::vector<StepPiece>> passes = cuda::PlanPasses(steps, token_cap_, row_cap_);
  const size_t before = logits->size();
  for (const std::vector<StepPiece>& pieces : passes) {
    if (absl::Status s = RunEager(steps, pieces, logits); !s.ok()) {
      logits->resize(before);
      return Fail(s);
    }
  }
  return absl::OkStatus();
}

}  // namespace prefixd::cuda

namespace prefixd {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  if (options.model == nullptr) return absl::InvalidArgumentError("no model");
  if (options.dtype == DType::kI8) {
    return absl::InvalidArgumentError(
        "the CUDA backend has no int8 weights (--dtype int8 is CPU only; use f32, f16 or bf16)");
  }
  const ModelConfig& c = options.model->config();
  if (absl::Status s = ValidateKvPoolOptions(options.kv_pool); !s.ok()) return s;
  if (options.max_step_tokens < 1 || options.max_logit_rows < 1) {
    return absl::InvalidArgumentError("max_step_tokens and max_logit_rows must be >= 1");
  }
  if (options.max_device_adapters < 0 || options.adapter_cache_bytes < 0) {
    return absl::InvalidArgumentError("max_device_adapters and adapter_cache_bytes must be >= 0");
  }
  if (options.kv_cache_fraction <= 0 || options.kv_cache_fraction > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_fraction must be in (0, 1], got ", options.kv_cache_fraction));
  }
  if (c.n_head < 1 || c.n_embd % c.n_head != 0 || c.head_dim() > cuda::kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA backend needs n_embd divisible by n_head and head_dim <= %d",
                        cuda::kMaxAttentionHeadDim));
  }
  if (c.activation_function != "gelu_new" && c.activation_function != "gelu_pytorch_tanh") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported activation_function ", c.activation_function));
  }
  if (absl::Status s = CudaDeviceAvailable(options.device); !s.ok()) return s;
  auto backend = std::make_unique<cuda::CudaBackend>(options);
  if (absl::Status s = backend->Init(); !s.ok()) {
    backend.reset();
    // Start-up failures are answered here; a non-sticky error (out of memory) must not stay
    // behind as the thread's last error for whoever launches next.
    cudaGetLastError();
    return s;
  }
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace prefixd
