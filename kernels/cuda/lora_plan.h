// Host-side planning of the CUDA backend's LoRA path (engine/lora_adapter.h): which rows of a
// pass get which adapter, how an adapter's device copy is laid out, and which device copies
// stay resident. Pure host code with no CUDA header: tested without a device
// (tests/kernels_cuda/lora_plan_test.cc).
//
// The device side (kernels/cuda/lora_update.cuh) runs one launch per (layer, target) over
// every row of the pass; each row reads its own entry of a per-row table (null: the base) and
// its adapter's A and B through that entry. The plan below is what fills the table.
//
// Invariants of PlanLoraPass' result:
//  - row_slot has one entry per row of the pass (pieces in order, each piece's tokens in
//    order, then num_rows - tokens padding rows), -1 for a row of the base or a padding row;
//  - adapters lists each adapter of the pass once (by digest: two objects with the same
//    digest are the same weights and share a slot), in order of first use; every slot is
//    used by at least one row;
//  - segments are the maximal runs of consecutive rows with the same slot >= 0, in row order;
//    their lengths sum to lora_rows;
//  - max_rank is the largest rank of `adapters` (0 when there is none).
//
// LoraDeviceLru (invariants): each resident digest has one entry with its bytes and the tick
// of its last use; bytes() is their sum; Victims never names a digest of `keep` and names
// residents least recently used first.
#ifndef PREFIXD_KERNELS_CUDA_LORA_PLAN_H_
#define PREFIXD_KERNELS_CUDA_LORA_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/lora_adapter.h"
#include "engine/model_config.h"
#include "kernels/cuda/step_plan.h"

namespace prefixd::cuda {

// The largest rank the update kernel takes: its per-row x·Aᵀ lives in shared memory (16 KiB
// at this rank). It equals the largest rank ParseLoraAdapter accepts.
inline constexpr int32_t kCudaLoraMaxRank = 4096;

// OK when the CUDA backend can apply `adapter` to a model of `base`'s shape:
// INVALID_ARGUMENT (CheckLoraAdapterFits' message) when it was made for another model,
// UNIMPLEMENTED when its rank is above kCudaLoraMaxRank.
absl::Status CheckCudaLoraAdapter(const LoraAdapter& adapter, const ModelConfig& base);

struct LoraSegment {
  int32_t begin = 0;   // first row of the pass
  int32_t length = 0;  // rows
  int32_t slot = 0;    // index into LoraPassPlan::adapters

  bool operator==(const LoraSegment&) const = default;
};

struct LoraPassPlan {
  std::vector<const LoraAdapter*> adapters;
  std::vector<int32_t> row_slot;
  std::vector<LoraSegment> segments;
  int32_t lora_rows = 0;  // rows with an adapter
  int32_t max_rank = 0;

  // No row of the pass has an adapter: the pass runs exactly as without LoRA.
  bool empty() const { return lora_rows == 0; }
};

// The plan of one pass of `pieces` over `steps` (kernels/cuda/step_plan.h), padded to
// `num_rows` rows (at least the pieces' tokens; a graph batch pads to its bucket).
LoraPassPlan PlanLoraPass(absl::Span<const SequenceStep> steps, absl::Span<const StepPiece> pieces,
                          int32_t num_rows);

// The adapters of a whole Forward(), once each by digest, in order of first use.
std::vector<const LoraAdapter*> DistinctAdapters(absl::Span<const SequenceStep> steps);

// Where each part of one adapter's device copy lives in its single allocation (offsets in
// bytes, each a multiple of 256): first the module table (n_layer x kNumLoraTargets entries
// of `table_entry_bytes`, entry l * kNumLoraTargets + target), then per module in that order
// A as [rank, in] and B transposed as [rank, out], both in the backend's dtype. A module the
// adapter leaves alone has offsets -1 (and a null table entry).
struct LoraArenaLayout {
  int64_t table_offset = 0;
  std::vector<int64_t> a_offset;  // [n_layer * kNumLoraTargets]
  std::vector<int64_t> b_offset;
  int64_t bytes = 0;  // the whole allocation
};
LoraArenaLayout PlanLoraArena(const LoraAdapter& adapter, int32_t n_layer, int64_t element_bytes,
                              int64_t table_entry_bytes);

// Least-recently-used bookkeeping of the device copies, by digest. The limits are what stays
// resident between steps: a step's own adapters are always made resident, even when they
// alone exceed the limits (they are trimmed at a later step that does not use them).
class LoraDeviceLru {
 public:
  LoraDeviceLru(int32_t max_adapters, int64_t max_bytes)
      : max_adapters_(max_adapters), max_bytes_(max_bytes) {}

  bool Contains(const std::string& digest) const { return entries_.contains(digest); }
  int32_t size() const { return static_cast<int32_t>(entries_.size()); }
  int64_t bytes() const { return bytes_; }

  // `digest` (resident) was used now.
  void Touch(const std::string& digest);
  // `digest` became resident with `bytes`, used now. It must not be resident already.
  void Insert(const std::string& digest, int64_t bytes);
  // `digest` is no longer resident (no-op when it is not).
  void Erase(const std::string& digest);

  // Residents to free, least recently used first, so that `incoming` more adapters of
  // `incoming_bytes` fit within the limits; never one of `keep`. Fewer than needed when the
  // rest are all in `keep`.
  std::vector<std::string> Victims(int32_t incoming, int64_t incoming_bytes,
                                   const absl::flat_hash_set<std::string>& keep) const;

 private:
  struct Entry {
    int64_t bytes = 0;
    uint64_t last_use = 0;
  };
  int32_t max_adapters_;
  int64_t max_bytes_;
  absl::flat_hash_map<std::string, Entry> entries_;
  int64_t bytes_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace prefixd::cuda

#endif  // PREFIXD_KERNELS_CUDA_LORA_PLAN_H_
