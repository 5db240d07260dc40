// The tiers behind an engine's pool, built in one place: which tiers EngineOptions ask for,
// in the order the offloader matches into them (engine/kv_offloader.h), with the block
// layout they all store (cache/block_record.h). Engine-internal: engine.h and the front ends
// see neither the tiers nor the record format.
//
// A new tier is one class deriving from KvTier (cache/tier.h) in its own file, its options in
// EngineOptions, and one entry in OpenTiers (engine/kv_tiers.cc) with its place in the order
// and how its counters reach EngineStats.
#ifndef PREFIXD_ENGINE_KV_TIERS_H_
#define PREFIXD_ENGINE_KV_TIERS_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_record.h"
#include "cache/tier.h"
#include "engine/engine_options.h"
#include "engine/engine_stats.h"
#include "engine/tier_event_inbox.h"

namespace prefixd {

// The block layout of an engine's blocks: its manifest, the backend's kv_numerics(), dtype,
// K/V element size and block size, the model's layer and head geometry. INVALID_ARGUMENT when
// the backend's kv_bytes_per_token() is not a whole element size for that geometry (its
// blocks could not be described).
absl::StatusOr<BlockLayout> EngineBlockLayout(const EngineOptions& options);

// One tier of an engine, and how its counters reach a stats snapshot (thread-safe: the tier's
// counters are read under its own lock).
struct EngineTier {
  std::unique_ptr<KvTier> tier;
  std::function<void(EngineStats*)> read_stats;
};

// Opens the tiers `options` ask for, in lookup order: the disk tier (--cache-dir), then the
// remote tier (--kv-remote). INVALID_ARGUMENT for a tier without the prefix cache or with
// bad options; the disk tier's FAILED_PRECONDITION when its directory cannot be used.
// `disk_events`, when given, receives the disk tier's block events (its on_store and
// on_delete, replacing any in options.disk_tier), the files found at start-up included: the
// KV events' DISK medium. The remote tier reports none (docs/SCALING.md: it is the fleet's,
// not a replica's).
absl::StatusOr<std::vector<EngineTier>> OpenTiers(
    const EngineOptions& options, std::shared_ptr<TierEventInbox> disk_events = nullptr);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_KV_TIERS_H_
