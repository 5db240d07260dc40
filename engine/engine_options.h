// EngineOptions: what an Engine is built from (engine/engine.h), and the disk tier layout
// those options give its blocks.
#ifndef PREFIXD_ENGINE_ENGINE_OPTIONS_H_
#define PREFIXD_ENGINE_ENGINE_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/disk/block_file.h"
#include "cache/disk/disk_tier_options.h"
#include "cache/remote/remote_tier_options.h"
#include "engine/backend.h"
#include "engine/model_config.h"

namespace prefixd {

struct EngineOptions {
  Backend* backend = nullptr;   // not owned; used only from the engine thread
  ModelConfig model_config;
  std::string manifest_sha256;  // part of every cache block's identity
  int32_t max_batch_tokens = 512;
  int32_t max_queue = 1024;
  int32_t max_samples = 16;
  bool enable_prefix_cache = true;
  // Injected for tests (TTFT/TPOT measurements); defaults to absl::Now.
  std::function<absl::Time()> clock;
  // Called once, from the engine thread, when the backend reports a fatal device error
  // (IsFatalDeviceError, engine/backend.h). By then every request has ended with INTERNAL,
  // and Submit refuses new ones with UNAVAILABLE: the process should stop so that an
  // orchestrator restarts it.
  std::function<void(const absl::Status&)> on_fatal_error;
  // Second cache tier on local disk (cache/disk/disk_tier.h); off while disk_tier.dir is
  // empty. Cached blocks the pool evicts are written there (off the engine thread, dropped
  // when the write queue is full), admissions continue their prefix match into it, and on
  // Shutdown the blocks still cached are written within what is left of the grace, at most
  // kDiskTierShutdownSpill. Needs enable_prefix_cache. Engine::Create fails with the tier's
  // FAILED_PRECONDITION when the directory cannot be used (not writable, locked by another
  // process).
  DiskTierOptions disk_tier;
  // Shared cache tier on Redis (cache/remote/remote_tier.h); off while remote_tier.url is
  // empty. Every full block this engine computes is published to it (asynchronously, dropped
  // when the queue is full or the tier is down), and admissions continue their prefix match
  // into it after the pool's and the disk tier's. Needs enable_prefix_cache.
  RemoteTierOptions remote_tier;
};

// The longest Shutdown spends writing cached blocks to the disk tier (and publishing the
// remote tier's queue).
inline constexpr absl::Duration kDiskTierShutdownSpill = absl::Seconds(10);

// The disk tier layout of an engine's blocks: its manifest, the backend's kv_numerics(),
// dtype, K/V element size and block size, the model's layer and head geometry.
// INVALID_ARGUMENT when the backend's kv_bytes_per_token() is not a whole element size for
// that geometry (its blocks could not be described).
absl::StatusOr<DiskLayout> EngineDiskLayout(const EngineOptions& options);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_ENGINE_OPTIONS_H_
