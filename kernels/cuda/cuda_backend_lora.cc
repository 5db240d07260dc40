// The CUDA backend's LoRA adapters (the class and its invariants are in cuda_backend_impl.h):
// the adapters' device copies, and each pass's LoRA rows and updates.
//
// A Forward() first makes the device copy of each of its adapters resident
// (UploadAdapter: A and B in the dtype, keyed by the adapter's digest, so a name reloaded
// with other files gets other device weights), evicting least recently used copies that the
// step does not use beyond max_device_adapters / adapter_cache_bytes (lora_plan.h). A pass
// then uploads its rows' table (UploadLoraRows), and after each targeted product LoraUpdate
// adds those rows' updates (lora_update.cuh).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "engine/dtype.h"
#include "engine/lora_adapter.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/lora_plan.h"
#include "kernels/cuda/lora_update.cuh"

namespace prefixd::cuda {

static_assert(cuda::kCudaLoraMaxRank == cuda::kLoraUpdateMaxRank,
              "lora_plan.h and lora_update.cuh must agree on the largest rank");

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

}  // namespace prefixd::cuda
