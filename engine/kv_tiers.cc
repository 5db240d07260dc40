#include "engine/kv_tiers.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/disk/disk_tier.h"
#include "cache/remote/remote_tier.h"
#include "cache/sha256.h"
#include "engine/score_store.h"

namespace prefixd {

absl::StatusOr<BlockLayout> EngineBlockLayout(const EngineOptions& options) {
  const ModelConfig& c = options.model_config;
  const Backend& b = *options.backend;
  // The stored element is what the backend keeps, not the weights' dtype: the CPU backend
  // holds fp32 K/V under f16 weights.
  const int64_t elements_per_token = 2 * int64_t{c.n_layer} * c.n_head * c.head_dim();
  if (elements_per_token <= 0 || b.kv_bytes_per_token() % elements_per_token != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk cache tier: the backend keeps ", b.kv_bytes_per_token(),
                     " K/V bytes per token, not a whole element size for ", elements_per_token,
                     " elements (2 x layers x heads x head_dim)"));
  }
  BlockLayout l;
  l.manifest_key = Sha256Of(options.manifest_sha256);
  l.numerics_key = Sha256Of(b.kv_numerics());
  l.dtype = static_cast<uint32_t>(b.dtype());
  l.element_bytes = static_cast<uint32_t>(b.kv_bytes_per_token() / elements_per_token);
  l.block_size = static_cast<uint32_t>(b.block_size());
  l.n_layer = static_cast<uint32_t>(c.n_layer);
  l.n_head = static_cast<uint32_t>(c.n_head);
  l.head_dim = static_cast<uint32_t>(c.head_dim());
  l.score_top_k = kScoreTopK;
  return l;
}

namespace {

// Opens a tier of type T (T::Open(tier_options, layout), T::Stats()) and appends it to *tiers
// with its counters' place in EngineStats. `flag` names it in the error of a tier without the
// prefix cache.
template <typename T, typename TierOptions, typename Stats>
absl::Status AddTier(const EngineOptions& options, const char* flag,
                     const TierOptions& tier_options, Stats EngineStats::*stats,
                     std::vector<EngineTier>* tiers) {
  if (!options.enable_prefix_cache) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " needs the prefix cache: drop --no-prefix-cache"));
  }
  absl::StatusOr<BlockLayout> layout = EngineBlockLayout(options);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<std::unique_ptr<T>> opened = T::Open(tier_options, *layout);
  if (!opened.ok()) return opened.status();
  T* tier = opened->get();
  tiers->push_back(
      {*std::move(opened), [tier, stats](EngineStats* s) { s->*stats = tier->Stats(); }});
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<EngineTier>> OpenTiers(const EngineOptions& options,
                                                  std::shared_ptr<TierEventInbox> disk_events) {
  std::vector<EngineTier> tiers;
  absl::Status s;
  DiskTierOptions disk = options.disk_tier;
  if (disk_events != nullptr) {
    disk.on_store = [in = disk_events](const BlockRecordHead& head) { in->PushStored(head); };
    disk.on_delete = [in = disk_events](const Digest& key) { in->PushDeleted(key); };
  }
  // One statement per tier, in lookup order: the local disk first, then the fleet's Redis.
  if (s.ok() && !options.disk_tier.dir.empty()) {
    s = AddTier<DiskTier>(options, "--cache-dir", disk, &EngineStats::disk, &tiers);
  }
  if (s.ok() && !options.remote_tier.url.empty()) {
    s = AddTier<RemoteTier>(options, "--kv-remote", options.remote_tier, &EngineStats::remote,
                            &tiers);
  }
  if (!s.ok()) return s;
  return tiers;
}

}  // namespace prefixd
