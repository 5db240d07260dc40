// The CUDA backend's forward pass. Per pass of T tokens (EnqueueForward), all on one stream:
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
// LoRA adapters: a Forward() first makes the device copy of each of its adapters resident
// (UploadAdapter: A and B in the dtype, keyed by the adapter's digest, so a name reloaded
// with other files gets other device weights), evicting least recently used copies that the
// step does not use beyond max_device_adapters / adapter_cache_bytes (lora_plan.h). Decode
// graphs are keyed by (bucket, attention splits, has adapters): the LoRA launches read their
// rows' adapters from the table uploaded before each replay, so one graph serves every mix
// of adapters and ranks.
#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "cache/kv_layout.h"
#include "engine/lora_adapter.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/block_copy.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/kv_budget.h"
#include "kernels/cuda/kv_pool_layout.h"
#include "kernels/cuda/kv_write.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/lora_plan.h"
#include "kernels/cuda/lora_update.cuh"
#include "kernels/cuda/step_plan.h"

namespace prefixd {
namespace {

using cuda::StepPiece;

static_assert(cuda::kCudaLoraMaxRank == cuda::kLoraUpdateMaxRank,
              "lora_plan.h and lora_update.cuh must agree on the largest rank");

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

struct LayerWeights {
  const void* ln1_g;
  const void* ln1_b;
  const void* qkv_w;   // [E, 3E]
  const void* qkv_b;   // [3E]
  const void* proj_w;  // [E, E]
  const void* proj_b;
  const void* ln2_g;
  const void* ln2_b;
  const void* fc_w;   // [E, I]
  const void* fc_b;   // [I]
  const void* fc2_w;  // [I, E]
  const void* fc2_b;  // [E]
};

// Device pointers of one pass's metadata (see MetaLayout).
struct PassMeta {
  int32_t num_tokens = 0;
  int32_t num_rows = 0;                // logit rows
  int32_t attention_splits = 1;        // AttentionSplits for this pass's longest sequence
  const int32_t* tokens = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;  // [num_tokens]
  const int32_t* slots = nullptr;      // [num_tokens]
  const int32_t* token_seq = nullptr;  // [num_tokens]
  const int32_t* rows = nullptr;       // [num_rows] token index of each logit row
  const int32_t* tables = nullptr;     // [num_seqs, max_blocks_per_seq]
  // [num_tokens] each row's adapter (lora_update.cuh); null: no row has one, and the pass
  // launches no LoRA kernel.
  const cuda::LoraRowDevice* lora_rows = nullptr;
};

// One int32 buffer holds a pass's metadata, sections back to back so one copy uploads it:
// tokens, positions, slots, token_seq (each token_cap), rows (row_cap), tables
// (seq_cap x max_blocks_per_seq). Eager passes use their exact sizes as caps; a graph of
// batch B uses caps (B, B, B) so that the captured pointers stay valid on every replay.
struct MetaLayout {
  int64_t tokens, positions, slots, token_seq, rows, tables, total;
  MetaLayout(int64_t token_cap, int64_t row_cap, int64_t seq_cap, int64_t max_blocks) {
    tokens = 0;
    positions = token_cap;
    slots = 2 * token_cap;
    token_seq = 3 * token_cap;
    rows = 4 * token_cap;
    tables = rows + row_cap;
    total = tables + seq_cap * max_blocks;
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options)
      : options_(options),
        config_(options.model->config()),
        lora_lru_(options.max_device_adapters, options.adapter_cache_bytes) {}
  ~CudaBackend() override;

  absl::Status Init();

  std::string device_name() const override {
    return absl::StrCat("cuda:", options_.device,
                        CudaDeviceIsInterpreted() ? " (interpreted on the CPU)" : "");
  }
  // cuBLAS picks its algorithms by architecture and version, so K/V bits are only known to
  // repeat on the same pair.
  std::string kv_numerics() const override { return kv_numerics_; }
  DType dtype() const override { return options_.dtype; }
  int64_t num_blocks() const override { return num_blocks_; }
  int32_t block_size() const override { return options_.kv_pool.block_size; }
  int64_t kv_bytes_per_token() const override {
    return KvBytesPerToken(config_.n_layer, config_.n_head, config_.head_dim(),
                           DTypeSize(options_.dtype));
  }
  MemoryUsage memory_usage() const override {
    MemoryUsage u = usage_;  // written by Init only
    u.adapter_bytes = adapter_bytes_.load(std::memory_order_relaxed);
    return u;
  }
  BackendCounters counters() const override {
    BackendCounters c;
    c.graph_fallbacks = graph_fallbacks_.load(std::memory_order_relaxed);
    return c;
  }
  bool applies_lora() const override { return true; }
  bool computes_all_logits() const override { return true; }

 protected:
  StepLimits step_limits() const override { return {config_.n_positions, config_.vocab_size}; }
  // INVALID_ARGUMENT for an adapter of another model, UNIMPLEMENTED for a rank the update
  // kernel does not take.
  absl::Status CheckAdapter(const LoraAdapter& adapter) const override {
    return cuda::CheckCudaLoraAdapter(adapter, config_);
  }
  absl::Status RunCopyBlocks(absl::Span<const BlockCopy> copies) override;
  absl::Status RunReadKvBlock(int32_t block, absl::Span<uint8_t> out) override;
  absl::Status RunWriteKvBlock(int32_t block, absl::Span<const uint8_t> data) override;
  absl::Status RunForward(absl::Span<const SequenceStep> steps, std::vector<float>* logits) override;

 private:
  absl::Status Malloc(size_t bytes, void** ptr);
  absl::Status UploadWeights();
  absl::Status UploadTensor(std::string_view name, const void** out, char** arena);
  // Fills the pinned metadata for `pieces` with the given caps and returns device pointers.
  PassMeta WriteMeta(absl::Span<const SequenceStep> steps, absl::Span<const StepPiece> pieces,
                     int32_t token_cap, int32_t row_cap, int32_t num_tokens, int32_t num_rows);
  // Uploads the first `ints` ints of the pinned metadata.
  absl::Status UploadMeta(int64_t ints);
  // Makes every adapter of `steps` resident on the device (evicting first, then uploading),
  // and marks them used now. RESOURCE_EXHAUSTED (not fatal) when a copy does not fit.
  absl::Status MakeAdaptersResident(absl::Span<const SequenceStep> steps);
  absl::Status UploadAdapter(const LoraAdapter& adapter);
  void FreeAdapter(const std::string& digest);
  // Fills and uploads the first plan.row_slot.size() rows of the LoRA table and points
  // meta->lora_rows at it; leaves it null for a plan without adapters.
  absl::Status UploadLoraRows(const cuda::LoraPassPlan& plan, PassMeta* meta);
  // After the product of `module` (layer * 4 + target) wrote y: its rows' LoRA updates.
  absl::Status LoraUpdate(const PassMeta& m, int32_t layer, LoraTarget target, const void* x,
                          int32_t in, float* y, int32_t out);
  // Enqueues the whole forward pass (no host synchronisation: capturable).
  absl::Status EnqueueForward(const PassMeta& meta);
  absl::Status Gemm(int32_t rows, int32_t k, int32_t n, const void* x, const void* w,
                    bool w_transposed, float beta, float* y);
  absl::Status RunEager(absl::Span<const SequenceStep> steps, absl::Span<const StepPiece> pieces,
                        std::vector<float>* logits);
  absl::Status RunGraph(absl::Span<const SequenceStep> steps, std::vector<float>* logits);
  // Captures and instantiates the graph of `meta` (the step just run eagerly). OK with
  // *exec set, or OK with *exec null after a recoverable failure (the shape then runs
  // eagerly); a fatal status when the context is broken.
  absl::Status CaptureGraph(const PassMeta& meta, cudaGraphExec_t* exec);
  // Copies logit rows [0, num_rows) to the host, waits for the stream (which also frees the
  // pinned metadata for the next pass) and appends rows `append` in order to `logits`.
  absl::Status CopyLogitsOut(int32_t num_rows, absl::Span<const int32_t> append,
                             std::vector<float>* logits);
  // Records a failure as sticky (every later call returns it).
  absl::Status Fail(absl::Status status);

  const CudaBackendOptions options_;
  const ModelConfig config_;
  int32_t n_inner_ = 0;
  int32_t max_blocks_per_seq_ = 0;
  cuda::KvPoolLayout layout_;
  int64_t num_blocks_ = 0;
  MemoryUsage usage_;
  std::string kv_numerics_;  // set by Init
  absl::Status broken_;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::vector<void*> device_allocs_;
  std::vector<void*> host_allocs_;

  // Weights.
  const void* wte_ = nullptr;      // [V, E]
  const void* wpe_ = nullptr;      // [P, E]
  const void* lnf_g_ = nullptr;    // [E]
  const void* lnf_b_ = nullptr;    // [E]
  const void* lm_head_ = nullptr;  // [V, E]; == wte_ when tied
  std::vector<LayerWeights> layers_;

  void* kv_pool_ = nullptr;  // KvPoolLayout, num_blocks_ + 1 blocks

  // Activations, sized for token_cap_ tokens and row_cap_ logit rows.
  int32_t token_cap_ = 0;
  int32_t row_cap_ = 0;
  float* x_ = nullptr;         // [token_cap, E] fp32 residual stream
  void* h_ = nullptr;          // [token_cap, E] dtype: LayerNorm output, then attention output
  float* scratch_ = nullptr;   // [token_cap, max(3E, I)] fp32: QKV, then the c_fc product
  void* u_ = nullptr;          // [token_cap, I] dtype: gelu output
  void* final_h_ = nullptr;    // [row_cap, E] dtype: ln_f of the logit rows
  float* d_logits_ = nullptr;  // [row_cap, V] fp32
  int32_t num_sms_ = 0;
  float* partials_ = nullptr;  // AttentionPartialFloats of a split pass (bounded in Init)
  int64_t partial_floats_ = 0;
  int32_t* d_meta_ = nullptr;                   // MetaLayout ints
  int32_t* h_meta_ = nullptr;                   // pinned twin of d_meta_
  float* h_logits_ = nullptr;                   // pinned [row_cap, V]
  int32_t* d_copies_ = nullptr;                 // [kMaxCopiesPerLaunch, 3]
  int32_t* h_copies_ = nullptr;                 // pinned twin
  cuda::LoraRowDevice* d_lora_rows_ = nullptr;  // [token_cap] the pass's LoRA table
  cuda::LoraRowDevice* h_lora_rows_ = nullptr;  // pinned twin

  // Resident device copies of adapters, by digest: one allocation each (lora_plan.h's
  // arena), freed on eviction. Engine thread only; adapter_bytes_ is their sum, for
  // memory_usage() on any thread.
  struct DeviceAdapter {
    void* arena = nullptr;
    int64_t bytes = 0;
    const cuda::LoraModuleDevice* modules = nullptr;  // the arena's module table
  };
  absl::flat_hash_map<std::string, DeviceAdapter> device_adapters_;
  cuda::LoraDeviceLru lora_lru_;
  std::atomic<int64_t> adapter_bytes_{0};

  // (decode batch bucket, attention splits, has adapters) -> graph, or null where capture
  // failed and the shape runs eagerly. The captured launches depend on these only;
  // positions, tables and the rows' adapters are read from d_meta_ and d_lora_rows_.
  std::map<std::tuple<int32_t, int32_t, bool>, cudaGraphExec_t> graphs_;
  std::atomic<int64_t> graph_fallbacks_{0};
};

constexpr int32_t kMaxCopiesPerLaunch = 4096;

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

absl::Status CudaBackend::LoraUpdate(const PassMeta& m, int32_t layer, LoraTarget target,
                                     const void* x, int32_t in, float* y, int32_t out) {
  if (m.lora_rows == nullptr) return absl::OkStatus();
  cuda::LoraUpdateArgs a;
  a.rows = m.lora_rows;
  a.num_rows = m.num_tokens;
  a.module = layer * kNumLoraTargets + static_cast<int32_t>(target);
  a.x = x;
  a.ld_x = in;
  a.in = in;
  a.y = y;
  a.ld_y = out;
  a.out = out;
  PREFIXD_CUDA_RETURN_IF_ERROR(cuda::LaunchLoraUpdate(options_.dtype, a, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::UploadLoraRows(const cuda::LoraPassPlan& plan, PassMeta* meta) {
  meta->lora_rows = nullptr;
  if (plan.empty()) return absl::OkStatus();
  const int32_t n = static_cast<int32_t>(plan.row_slot.size());
  PREFIXD_CHECK(n == meta->num_tokens && n <= token_cap_);
  std::vector<cuda::LoraRowDevice> slots(plan.adapters.size());
  for (size_t i = 0; i < plan.adapters.size(); ++i) {
    const LoraAdapter& a = *plan.adapters[i];
    // MakeAdaptersResident ran for every adapter of the Forward.
    slots[i].modules = device_adapters_.at(a.digest).modules;
    slots[i].rank = a.rank;
    slots[i].scaling = a.scaling;
  }
  for (int32_t r = 0; r < n; ++r) {
    const int32_t slot = plan.row_slot[r];
    h_lora_rows_[r] = slot < 0 ? cuda::LoraRowDevice{} : slots[slot];
  }
  // The pinned table is free again once the pass's CopyLogitsOut has synchronised.
  PREFIXD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_lora_rows_, h_lora_rows_,
                                               n * sizeof(cuda::LoraRowDevice),
                                               cudaMemcpyHostToDevice, stream_));
  meta->lora_rows = d_lora_rows_;
  return absl::OkStatus();
}

absl::Status CudaBackend::MakeAdaptersResident(absl::Span<const SequenceStep> steps) {
  const std::vector<const LoraAdapter*> adapters = cuda::DistinctAdapters(steps);
  if (adapters.empty()) return absl::OkStatus();
  absl::flat_hash_set<std::string> keep;
  int32_t incoming = 0;
  int64_t incoming_bytes = 0;
  const int64_t elt = DTypeSize(options_.dtype);
  for (const LoraAdapter* a : adapters) {
    keep.insert(a->digest);
    if (!lora_lru_.Contains(a->digest)) {
      ++incoming;
      incoming_bytes +=
          cuda::PlanLoraArena(*a, config_.n_layer, elt, sizeof(cuda::LoraModuleDevice)).bytes;
    }
  }
  // Every earlier pass ended with a stream synchronisation, so no kernel still reads a
  // victim's copy.
  for (const std::string& digest : lora_lru_.Victims(incoming, incoming_bytes, keep)) {
    FreeAdapter(digest);
  }
  for (const LoraAdapter* a : adapters) {
    if (lora_lru_.Contains(a->digest)) {
      lora_lru_.Touch(a->digest);
    } else if (absl::Status s = UploadAdapter(*a); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

void CudaBackend::FreeAdapter(const std::string& digest) {
  auto it = device_adapters_.find(digest);
  if (it == device_adapters_.end()) return;
  // A failure here would come back from the next checked call; the memory is gone either way.
  cudaFree(it->second.arena);
  adapter_bytes_.fetch_sub(it->second.bytes, std::memory_order_relaxed);
  device_adapters_.erase(it);
  lora_lru_.Erase(digest);
}

absl::Status CudaBackend::UploadAdapter(const LoraAdapter& adapter) {
  const DType dt = options_.dtype;
  const int64_t elt = DTypeSize(dt);
  const cuda::LoraArenaLayout layout =
      cuda::PlanLoraArena(adapter, config_.n_layer, elt, sizeof(cuda::LoraModuleDevice));
  void* arena = nullptr;
  if (absl::Status s = cuda::DeviceAlloc(layout.bytes, &arena); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("LoRA adapter ", adapter.dir, " (", layout.bytes,
                                               " bytes on the device): ", s.message()));
  }
  // Staged on the host in the arena's exact layout, then one copy.
  std::vector<char> staging(layout.bytes, 0);
  char* base = static_cast<char*>(arena);
  auto put = [&](int64_t offset, int64_t i, float v) {
    if (dt == DType::kF32) {
      std::memcpy(&staging[offset + 4 * i], &v, 4);
    } else {
      const uint16_t h = dt == DType::kF16 ? FloatToHalf(v) : FloatToBF16(v);
      std::memcpy(&staging[offset + 2 * i], &h, 2);
    }
  };
  const int64_t r = adapter.rank;
  for (int32_t l = 0; l < config_.n_layer; ++l) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const LoraModule* m = adapter.module(l, static_cast<LoraTarget>(t));
      const int64_t i = int64_t{l} * kNumLoraTargets + t;
      if (m == nullptr) continue;
      const cuda::LoraModuleDevice entry = {base + layout.a_offset[i], base + layout.b_offset[i]};
      std::memcpy(&staging[layout.table_offset + i * sizeof(entry)], &entry, sizeof(entry));
      // A as [rank, in] (LoraModule holds it transposed, [in, rank]); B transposed as held.
      for (int64_t j = 0; j < r; ++j) {
        for (int64_t k = 0; k < m->in; ++k) {
          put(layout.a_offset[i], j * m->in + k, m->a_t[k * r + j]);
        }
      }
      for (int64_t e = 0; e < r * m->out; ++e) put(layout.b_offset[i], e, m->b_t[e]);
    }
  }
  auto copy = [&]() -> absl::Status {
    PREFIXD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(arena, staging.data(), staging.size(), cudaMemcpyHostToDevice, stream_));
    // The staging buffer is pageable and freed on return.
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  };
  if (absl::Status s = copy(); !s.ok()) {
    cudaFree(arena);
    return s;
  }
  device_adapters_[adapter.digest] = {
      arena, layout.bytes,
      reinterpret_cast<const cuda::LoraModuleDevice*>(base + layout.table_offset)};
  lora_lru_.Insert(adapter.digest, layout.bytes);
  adapter_bytes_.fetch_add(layout.bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status CudaBackend::RunCopyBlocks(absl::Span<const BlockCopy> copies) {
  if (!broken_.ok()) return broken_;
  auto run = [&]() -> absl::Status {
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    // One launch runs its copies in parallel; the contract runs them in order, so a copy
    // that touches a block an earlier one writes (or writes one it reads) starts a new launch.
    size_t begin = 0;
    for (const size_t end : IndependentCopyBatchEnds(copies, kMaxCopiesPerLaunch)) {
      const size_t n = end - begin;
      for (size_t i = 0; i < n; ++i) {
        h_copies_[3 * i] = copies[begin + i].src;
        h_copies_[3 * i + 1] = copies[begin + i].dst;
        h_copies_[3 * i + 2] = copies[begin + i].num_rows;
      }
      PREFIXD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(d_copies_, h_copies_, n * 3 * 4, cudaMemcpyHostToDevice, stream_));
      PREFIXD_CUDA_RETURN_IF_ERROR(cuda::LaunchBlockCopy(
          options_.dtype, d_copies_, static_cast<int32_t>(n), layout_, kv_pool_, stream_));
      // The pinned staging buffer is reused by the next launch.
      PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      begin = end;
    }
    return absl::OkStatus();
  };
  absl::Status s = run();
  return s.ok() ? s : Fail(s);
}

// A block is one contiguous range of the pool (kv_pool_layout.h), already in the byte layout
// the interface promises. The copies run on stream_, so they are ordered after every copy and
// Forward enqueued before; the host buffer is pageable, hence the synchronisation before
// returning (the caller may reuse or free it at once).
absl::Status CudaBackend::RunReadKvBlock(int32_t block, absl::Span<uint8_t> out) {
  if (!broken_.ok()) return broken_;
  auto run = [&]() -> absl::Status {
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    const char* src = static_cast<const char*>(kv_pool_) + int64_t{block} * KvBlockBytes();
    PREFIXD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out.data(), src, out.size(), cudaMemcpyDeviceToHost, stream_));
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  };
  absl::Status s = run();
  return s.ok() ? s : Fail(s);
}

absl::Status CudaBackend::RunWriteKvBlock(int32_t block, absl::Span<const uint8_t> data) {
  if (!broken_.ok()) return broken_;
  auto run = [&]() -> absl::Status {
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
    char* dst = static_cast<char*>(kv_pool_) + int64_t{block} * KvBlockBytes();
    PREFIXD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, data.data(), data.size(), cudaMemcpyHostToDevice, stream_));
    PREFIXD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  };
  absl::Status s = run();
  return s.ok() ? s : Fail(s);
}

}  // namespace

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
  auto backend = std::make_unique<CudaBackend>(options);
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
