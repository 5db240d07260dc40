// EngineStats: the snapshot an engine publishes after each step, and its parts.
#ifndef PREFIXD_ENGINE_ENGINE_STATS_H_
#define PREFIXD_ENGINE_ENGINE_STATS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cache/disk/disk_tier_stats.h"
#include "cache/kv_cache_stats.h"
#include "cache/remote/remote_tier_stats.h"

namespace prefixd {

// The scheduler's own counters (engine/scheduler.h keeps them).
struct SchedulerCounters {
  uint64_t prefill_tokens = 0;    // forwarded tokens that were not decodes of sampled tokens
  uint64_t generated_tokens = 0;  // emitted tokens (stop/EOS not counted)
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  uint64_t waiting_requests = 0;  // not running (never admitted, or all preempted)
  uint64_t running_requests = 0;  // at least one sequence running
  uint64_t disk_hit_tokens = 0;   // prompt tokens of first admissions loaded from the disk tier
  uint64_t remote_hit_tokens = 0;  // ... and from the remote tier
  // Prompt positions whose log-probability was returned (prompt length - 1 per request with
  // prompt_logprobs), and of those the ones taken from score records kept with cached blocks.
  uint64_t prompt_logprob_tokens = 0;
  uint64_t prompt_logprob_tokens_cached = 0;
};

// One snapshot, published by the engine thread after each step. Each part is its owner's
// struct, copied whole: a field added there reaches the metrics and GetCacheStats without a
// copy here that could forget it.
struct EngineStats {
  KvCacheStats cache;
  SchedulerCounters scheduler;
  DiskTierStats disk;      // all zero without a disk tier
  RemoteTierStats remote;  // all zero (configured false) without a remote tier
  // Each tenant that has sent a request (in order of first request): its part of the pool.
  std::vector<std::pair<std::string, TenantCacheStats>> tenants;
};

// The prompt tokens of first admissions of one adapter's requests (or the base's): what
// KvCacheStats::queried_tokens and HitTokens() count pool-wide, counted at the same points.
struct PromptTokenCounts {
  uint64_t queried_tokens = 0;  // prompt lengths
  uint64_t hit_tokens = 0;      // cached_prompt_tokens: pool, disk and remote tiers
};
// By EngineRequest::adapter_name ("" for requests on the base model). Summed over names it
// equals the growth of queried_tokens and HitTokens() over the same period.
using AdapterTokenCounts = std::map<std::string, PromptTokenCounts, std::less<>>;

// = Σ cached_prompt_tokens of first admissions: prompt tokens served from the pool plus
// those loaded from the disk and remote tiers.
inline uint64_t HitTokens(const EngineStats& s) {
  return s.cache.hit_tokens + s.scheduler.disk_hit_tokens + s.scheduler.remote_hit_tokens;
}

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_ENGINE_STATS_H_
