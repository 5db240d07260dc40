// The CUDA backend's internals: the CudaBackend class and the structs its three source files
// share (kernels/cuda/cuda_backend.h is the public face; only these files include this one):
//  - cuda_backend.cc: start-up (weights, buffers, the KV pool), the forward pass, CUDA graphs,
//    CreateCudaBackend;
//  - cuda_backend_lora.cc: the adapters' device copies and each pass's LoRA rows and updates;
//  - cuda_backend_kv.cc: block copies and whole-block K/V reads and writes.
//
// Invariants:
//  - Device and pinned buffers are allocated by Init (device_allocs_, host_allocs_) and freed
//    by the destructor, except the adapters' device copies (device_adapters_), allocated by
//    UploadAdapter and freed by FreeAdapter or the destructor.
//  - Every Run* call that returns OK leaves stream_ idle (it ends with a stream
//    synchronisation), so the next call starts with nothing in flight: the pinned staging
//    buffers (h_meta_, h_lora_rows_, h_copies_) are free, and no kernel still reads an adapter
//    copy that is evicted.
//  - broken_ is sticky: once Fail has recorded a fatal device error, every Run* call returns
//    it before touching the device.
//  - Only memory_usage() and counters() may run on another thread while a Run* call is in
//    progress; they read nothing but usage_ (written by Init) and atomics.
#ifndef PREFIXD_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_
#define PREFIXD_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cache/kv_layout.h"
#include "engine/backend.h"
#include "engine/dtype.h"
#include "engine/lora_adapter.h"
#include "engine/model.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kv_pool_layout.h"
#include "kernels/cuda/lora_plan.h"
#include "kernels/cuda/lora_update.cuh"
#include "kernels/cuda/step_plan.h"

namespace prefixd::cuda {

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

// Block copies per launch of RunCopyBlocks (d_copies_ and h_copies_ hold this many).
constexpr int32_t kMaxCopiesPerLaunch = 4096;

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
  absl::Status RunForward(absl::Span<const SequenceStep> steps,
                          std::vector<float>* logits) override;

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

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_CUDA_BACKEND_IMPL_H_
