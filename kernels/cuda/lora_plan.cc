#include "kernels/cuda/lora_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/check.h"

namespace prefixd::cuda {
namespace {

constexpr int64_t kArenaAlign = 256;

int64_t AlignUp(int64_t n) { return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }

}  // namespace

absl::Status CheckCudaLoraAdapter(const LoraAdapter& adapter, const ModelConfig& base) {
  if (absl::Status fits = CheckLoraAdapterFits(adapter, base); !fits.ok()) return fits;
  if (adapter.rank < 1 || adapter.rank > kCudaLoraMaxRank) {
    return absl::UnimplementedError(
        absl::StrCat("LoRA adapter ", adapter.dir, " has rank ", adapter.rank,
                     ": the CUDA backend applies ranks 1 to ", kCudaLoraMaxRank));
  }
  return absl::OkStatus();
}

LoraPassPlan PlanLoraPass(absl::Span<const SequenceStep> steps, absl::Span<const StepPiece> pieces,
                          int32_t num_rows) {
  LoraPassPlan plan;
  plan.row_slot.reserve(num_rows);
  // Slot of each digest seen in this pass.
  absl::flat_hash_map<std::string, int32_t> slot_of;
  for (const StepPiece& piece : pieces) {
    const LoraAdapter* a = steps[piece.step].adapter;
    int32_t slot = -1;
    if (a != nullptr) {
      auto [it, inserted] =
          slot_of.try_emplace(a->digest, static_cast<int32_t>(plan.adapters.size()));
      if (inserted) {
        plan.adapters.push_back(a);
        plan.max_rank = std::max(plan.max_rank, a->rank);
      }
      slot = it->second;
      plan.lora_rows += piece.length;
    }
    for (int32_t i = 0; i < piece.length; ++i) plan.row_slot.push_back(slot);
  }
  PREFIXD_CHECK(static_cast<int32_t>(plan.row_slot.size()) <= num_rows);
  plan.row_slot.resize(num_rows, -1);
  for (int32_t r = 0; r < num_rows; ++r) {
    const int32_t slot = plan.row_slot[r];
    if (slot < 0) continue;
    if (!plan.segments.empty() && plan.segments.back().slot == slot &&
        plan.segments.back().begin + plan.segments.back().length == r) {
      ++plan.segments.back().length;
    } else {
      plan.segments.push_back({r, 1, slot});
    }
  }
  return plan;
}

std::vector<const LoraAdapter*> DistinctAdapters(absl::Span<const SequenceStep> steps) {
  std::vector<const LoraAdapter*> out;
  absl::flat_hash_set<std::string> seen;
  for (const SequenceStep& s : steps) {
    if (s.adapter != nullptr && seen.insert(s.adapter->digest).second) out.push_back(s.adapter);
  }
  return out;
}

LoraArenaLayout PlanLoraArena(const LoraAdapter& adapter, int32_t n_layer, int64_t element_bytes,
                              int64_t table_entry_bytes) {
  PREFIXD_CHECK(n_layer >= 0 && element_bytes > 0 && table_entry_bytes > 0);
  LoraArenaLayout layout;
  const int64_t modules = int64_t{n_layer} * kNumLoraTargets;
  layout.table_offset = 0;
  int64_t at = AlignUp(modules * table_entry_bytes);
  layout.a_offset.assign(modules, -1);
  layout.b_offset.assign(modules, -1);
  const int64_t r = adapter.rank;
  for (int32_t l = 0; l < n_layer; ++l) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const LoraModule* m = adapter.module(l, static_cast<LoraTarget>(t));
      if (m == nullptr) continue;
      const int64_t i = int64_t{l} * kNumLoraTargets + t;
      layout.a_offset[i] = at;
      at += AlignUp(r * m->in * element_bytes);
      layout.b_offset[i] = at;
      at += AlignUp(r * m->out * element_bytes);
    }
  }
  layout.bytes = at;
  return layout;
}

void LoraDeviceLru::Touch(const std::string& digest) {
  auto it = entries_.find(digest);
  PREFIXD_CHECK(it != entries_.end());
  it->second.last_use = ++tick_;
}

void LoraDeviceLru::Insert(const std::string& digest, int64_t bytes) {
  PREFIXD_CHECK(bytes >= 0);
  const bool inserted = entries_.try_emplace(digest, Entry{bytes, ++tick_}).second;
  PREFIXD_CHECK(inserted);
  bytes_ += bytes;
}

void LoraDeviceLru::Erase(const std::string& digest) {
  auto it = entries_.find(digest);
  if (it == entries_.end()) return;
  bytes_ -= it->second.bytes;
  entries_.erase(it);
}

std::vector<std::string> LoraDeviceLru::Victims(
    int32_t incoming, int64_t incoming_bytes, const absl::flat_hash_set<std::string>& keep) const {
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (const auto& [digest, e] : entries_) {
    if (!keep.contains(digest)) order.push_back({e.last_use, &digest});
  }
  std::sort(order.begin(), order.end());
  std::vector<std::string> victims;
  int64_t count = static_cast<int64_t>(entries_.size()) + incoming;
  int64_t bytes = bytes_ + incoming_bytes;
  for (const auto& [tick, digest] : order) {
    if (count <= max_adapters_ && bytes <= max_bytes_) break;
    victims.push_back(*digest);
    --count;
    bytes -= entries_.at(*digest).bytes;
  }
  return victims;
}

}  // namespace prefixd::cuda
