#include "engine/kv_tiers.h"

#include <cstdint>
#include <utility>

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

absl::StatusOr<std::vector<EngineTier>> OpenTiers(const EngineOptions& options) {
  std::vector<EngineTier> tiers;
  // Each tier in lookup order: whether the options ask for it, its flag (for the prefix
  // cache's check), how it opens and how its counters are read.
  auto add = [&](bool wanted, const char* flag, auto open) -> absl::Status {
    if (!wanted) return absl::OkStatus();
    if (!options.enable_prefix_cache) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " needs the prefix cache: drop --no-prefix-cache"));
    }
    absl::StatusOr<BlockLayout> layout = EngineBlockLayout(options);
    if (!layout.ok()) return layout.status();
    absl::StatusOr<EngineTier> opened = open(*layout);
    if (!opened.ok()) return opened.status();
    tiers.push_back(*std::move(opened));
    return absl::OkStatus();
  };
  absl::Status s =
      add(!options.disk_tier.dir.empty(), "--cache-dir",
          [&](const BlockLayout& layout) -> absl::StatusOr<EngineTier> {
            absl::StatusOr<std::unique_ptr<DiskTier>> t = DiskTier::Open(options.disk_tier, layout);
            if (!t.ok()) return t.status();
            DiskTier* d = t->get();
            return EngineTier{*std::move(t), [d](EngineStats* s) { s->disk = d->Stats(); }};
          });
  if (!s.ok()) return s;
  s = add(!options.remote_tier.url.empty(), "--kv-remote",
          [&](const BlockLayout& layout) -> absl::StatusOr<EngineTier> {
            absl::StatusOr<std::unique_ptr<RemoteTier>> t =
                RemoteTier::Open(options.remote_tier, layout);
            if (!t.ok()) return t.status();
            RemoteTier* r = t->get();
            return EngineTier{*std::move(t), [r](EngineStats* s) { s->remote = r->Stats(); }};
          });
  if (!s.ok()) return s;
  return tiers;
}

}  // namespace prefixd
