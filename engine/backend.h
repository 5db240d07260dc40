// The seam between engine/ and kernels/: one forward step over a batch of sequences that
// read and write K/V through block tables. Both kernels/cpu and kernels/cuda implement it.
//
// A backend owns the weights and the KV storage for `num_blocks()` blocks, allocated once at
// construction from a byte budget and never grown. Block ids are the ones cache/ hands out.
// Sampling is the engine's; a backend only returns logits.
#ifndef PREFIXD_ENGINE_BACKEND_H_
#define PREFIXD_ENGINE_BACKEND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cache/block_copy.h"
#include "cache/kv_pool.h"
#include "engine/dtype.h"

namespace prefixd {

struct LoraAdapter;  // engine/lora_adapter.h

// One sequence's part of a step: a prefill chunk or a single decode token.
struct SequenceStep {
  // New tokens, at absolute positions [start_pos, start_pos + token_ids.size()).
  absl::Span<const uint32_t> token_ids;
  int32_t start_pos = 0;
  // Block ids covering positions [0, start_pos + token_ids.size()): position p lives in
  // block_table[p / block_size] at row p % block_size. Rows below start_pos must already
  // hold K/V of this exact prefix; the step writes the rows of the new tokens.
  absl::Span<const int32_t> block_table;
  // Return the logits of the last new token.
  bool want_logits = false;
  // Return the logits of every new token instead (prompt logprobs; only for a backend whose
  // computes_all_logits() is true). Each row is the same bits the last token's would be.
  bool want_all_logits = false;
  // The LoRA adapter whose update this sequence's rows get (null: the base model); only for
  // a backend whose applies_lora() is true. The caller keeps it alive through the call and
  // has checked that it fits the model (CheckLoraAdapterFits).
  const LoraAdapter* adapter = nullptr;
};

struct MemoryUsage {
  int64_t weights_bytes = 0;
  int64_t kv_pool_bytes = 0;
  int64_t workspace_bytes = 0;
  // The backend's own copies of LoRA adapters (the CUDA backend's device copies); 0 for a
  // backend that reads the engine's host tensors (the CPU backend).
  int64_t adapter_bytes = 0;
};

// Events a backend counts over its life (each only grows), for logs and metrics.
struct BackendCounters {
  // Decode batch shapes whose CUDA graph could not be captured or instantiated and that run
  // eagerly from then on (the CUDA backend; always 0 elsewhere).
  int64_t graph_fallbacks = 0;
};

// The payload key that marks a status as a sticky device failure: the backend is unusable
// from then on, so the server fails requests in flight, turns health NOT_SERVING and exits
// non-zero for an orchestrator to restart it. Backends add it; anyone can test for it.
inline constexpr absl::string_view kFatalDeviceErrorPayload = "prefixd/fatal-device-error";

inline bool IsFatalDeviceError(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kFatalDeviceErrorPayload).has_value();
}

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string device_name() const = 0;  // "cpu" | "cuda:0"
  // The weights' dtype. KV storage may be wider (the CPU backend keeps fp32 K/V under half
  // weights): kv_bytes_per_token() is what a block holds.
  virtual DType dtype() const = 0;
  // What, besides the model, dtype() and the block geometry, decides the bits of the K/V this
  // backend writes: the kernels' arithmetic ("cpu r1"; "cuda r1 sm_90 cublas 130000"). Blocks move
  // between processes (the disk tier) only when this string is equal, since K/V computed
  // another way would make a cache hit differ from a cold run. A backend whose kernels change
  // any K/V bit must change the string.
  virtual std::string kv_numerics() const = 0;
  virtual int64_t num_blocks() const = 0;
  virtual int32_t block_size() const = 0;
  virtual int64_t kv_bytes_per_token() const = 0;  // cache/kv_layout.h's formula
  // The three above as the one description of the pool the engine, its cache and the front
  // ends read (cache/kv_pool.h).
  KvPoolShape kv_pool() const { return {num_blocks(), block_size(), kv_bytes_per_token()}; }
  // Safe to call from any thread, also while Forward runs (the metrics endpoint does).
  virtual MemoryUsage memory_usage() const = 0;
  // Safe to call from any thread, also while Forward runs. Default: nothing counted.
  virtual BackendCounters counters() const { return {}; }
  // Whether Forward honours SequenceStep::want_all_logits (needed for prompt logprobs; the
  // engine refuses such requests on a backend without it). Default: no.
  virtual bool computes_all_logits() const { return false; }
  // Whether Forward honours SequenceStep::adapter, each row getting its own adapter's update
  // whatever else shares the batch (the engine refuses adapters on a backend without it).
  // Default: no; such a backend refuses a step with an adapter (UNIMPLEMENTED).
  virtual bool applies_lora() const { return false; }

  // Executes the copies in order; later Forward() calls see their result. A copy names two
  // different blocks of the pool and at most block_size rows; otherwise InvalidArgument and
  // nothing is copied.
  absl::Status CopyBlocks(absl::Span<const BlockCopy> copies);

  // One block's K/V as host bytes, for the disk tier: every row of every layer, laid out
  // [n_layer][2 (K, V)][n_head][block_size][head_dim] elements, exactly KvBlockBytes() of
  // them (the element is kv_bytes_per_token() / (2 n_layer n_head head_dim) bytes). Both
  // backends store a block this way; the values also depend on dtype() and kv_numerics().
  // ReadKvBlock sees every copy and Forward before it; WriteKvBlock's rows are what later calls
  // read. INVALID_ARGUMENT for a block outside the pool or a span of another size (nothing is
  // copied).
  int64_t KvBlockBytes() const { return int64_t{block_size()} * kv_bytes_per_token(); }
  absl::Status ReadKvBlock(int32_t block, absl::Span<uint8_t> out);
  absl::Status WriteKvBlock(int32_t block, absl::Span<const uint8_t> data);

  // Runs one step over `steps` (prefill chunks and decode tokens mixed, each sequence at most
  // once). Writes K/V of every new token into its row, and appends to `logits` one row of
  // vocab_size floats per step with want_logits (one per new token with want_all_logits), in
  // step order. Each logit depends only on the model and the sequence's tokens, never on the
  // rest of the batch (the CPU backend is bit-exact in this; CUDA within a stated tolerance).
  // INVALID_ARGUMENT, with nothing changed, for a step without tokens, positions outside the
  // context, a token outside the vocabulary, a block table too short or naming a block
  // outside the pool, or an adapter made for another model (UNIMPLEMENTED for an adapter this
  // backend cannot apply): CheckSteps.
  absl::Status Forward(absl::Span<const SequenceStep> steps, std::vector<float>* logits);

  // The contract of Forward's arguments, checked once here for every backend (Forward calls
  // it before the backend's own RunForward).
  absl::Status CheckSteps(absl::Span<const SequenceStep> steps) const;

 protected:
  // What CheckSteps needs of the model: positions [0, context) and ids [0, vocab_size).
  struct StepLimits {
    int32_t context = 0;
    int32_t vocab_size = 0;
  };
  virtual StepLimits step_limits() const = 0;
  // Whether this backend can apply `adapter` to a step's rows. Default: UNIMPLEMENTED, for a
  // backend whose applies_lora() is false.
  virtual absl::Status CheckAdapter(const LoraAdapter& adapter) const;

  // The backends' own work, called only with arguments the public calls above have checked.
  virtual absl::Status RunForward(absl::Span<const SequenceStep> steps,
                                  std::vector<float>* logits) = 0;
  virtual absl::Status RunCopyBlocks(absl::Span<const BlockCopy> copies) = 0;
  virtual absl::Status RunReadKvBlock(int32_t block, absl::Span<uint8_t> out) = 0;
  virtual absl::Status RunWriteKvBlock(int32_t block, absl::Span<const uint8_t> data) = 0;

 private:
  absl::Status CheckBlockBytes(int32_t block, size_t size) const;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_BACKEND_H_
