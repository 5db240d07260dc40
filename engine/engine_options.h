// EngineOptions: what an Engine is built from (engine/engine.h). The block layout those
// options give the tiers' records is the engine's own (engine/kv_tiers.h).
#ifndef PREFIXD_ENGINE_ENGINE_OPTIONS_H_
#define PREFIXD_ENGINE_ENGINE_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache/disk/disk_tier_options.h"
#include "cache/remote/remote_tier_options.h"
#include "engine/backend.h"
#include "engine/kv_events.h"
#include "engine/model_config.h"
#include "engine/tenant_policy.h"

namespace prefixd {

// The engine's options. The server's options hold one whole (ServerOptions::engine): the
// operator's fields below are prefixd flags, and Engine::Create checks each of them, once,
// with an error that names the flag as the operator types it. The fields above them are the
// wiring only whoever builds the engine knows (the server sets them from the loaded model
// and its backend, whatever a ServerOptions holds there).
struct EngineOptions {
  // ---- Set by whoever builds the engine -------------------------------------------------
  Backend* backend = nullptr;   // not owned; used only from the engine thread
  ModelConfig model_config;
  std::string manifest_sha256;  // part of every cache block's identity
  // Called once, from the engine thread, when the backend reports a fatal device error
  // (IsFatalDeviceError, engine/backend.h). By then every request has ended with INTERNAL,
  // and Submit refuses new ones with UNAVAILABLE: the process should stop so that an
  // orchestrator restarts it.
  std::function<void(const absl::Status&)> on_fatal_error;
  // Injected for tests (TTFT/TPOT measurements); defaults to absl::Now.
  std::function<absl::Time()> clock;
  // Where the KV events go (engine/kv_events.h: --kv-events, built by the server); null: none.
  // The engine thread hands it one batch per step that changed the prefix index.
  std::shared_ptr<KvEventSink> kv_events;

  // ---- The operator's ---------------------------------------------------------------------
  int32_t max_batch_tokens = 512;   // --max-batch-tokens: tokens per step (the scheduler's)
  int32_t max_queue = 1024;         // --max-queue: waiting requests before RESOURCE_EXHAUSTED
  int32_t max_samples = 16;         // --max-samples: the largest num_samples of a request
  bool enable_prefix_cache = true;  // false: --no-prefix-cache (the KvCache's option)
  // ---- Tenants (engine/tenant_policy.h; docs/SERVER.md "Tenants") ------------------------
  // --tenant-cache-share: the fraction of the pool a tenant's cached blocks may take before
  // its own are evicted first, unless its policy says otherwise. 1: off.
  double tenant_cache_share = 1.0;
  // --tenant-max-waiting: requests a tenant may have waiting before more are refused with
  // RESOURCE_EXHAUSTED naming it, unless its policy says otherwise. 0: no cap.
  int32_t tenant_max_waiting = 0;
  // --max-cache-retention: the longest prompt_cache_retention honoured (a longer request is
  // capped to it); zero turns retention off.
  absl::Duration max_cache_retention = absl::Hours(24);
  // The tenants' policies (the --auth-tokens file's); tenants not listed get the defaults
  // above and weight 1. Engine::SetTenantPolicies replaces them.
  std::vector<TenantPolicy> tenants;
  // --cache-dir (dir) and --cache-dir-bytes (max_bytes): the second cache tier on local disk
  // (cache/disk/disk_tier.h); off while dir is empty. Cached blocks the pool evicts are
  // written there (off the engine thread, dropped when the write queue is full), admissions
  // continue their prefix match into it, and on Shutdown the blocks still cached are written
  // within what is left of the grace, at most kDiskTierShutdownSpill. Needs
  // enable_prefix_cache. Engine::Create fails with the tier's FAILED_PRECONDITION when the
  // directory cannot be used (not writable, locked by another process).
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

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_ENGINE_OPTIONS_H_
