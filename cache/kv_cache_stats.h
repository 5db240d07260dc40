// KvCacheStats: the counters and block counts of one KvCache (cache/kv_cache.h), in a header
// of its own so that readers of a stats snapshot need not include the cache.
#ifndef PREFIXD_CACHE_KV_CACHE_STATS_H_
#define PREFIXD_CACHE_KV_CACHE_STATS_H_

#include <cstdint>

namespace prefixd {

// Counted in tokens and blocks. queried_tokens and hit_tokens count first admissions only
// (AdmissionRequest::readmission = false): a request re-admitted after preemption is not a
// new query, even though it usually hits its own cached prefix.
struct KvCacheStats {
  uint64_t queried_tokens = 0;  // sum of prompt lengths of first admissions
  uint64_t hit_tokens = 0;      // sum of their num_cached
  int64_t blocks_total = 0;     // = free + active + cached
  int64_t blocks_free = 0;
  int64_t blocks_active = 0;  // owned by at least one sequence
  int64_t blocks_cached = 0;  // indexed, unowned, evictable
  uint64_t evictions = 0;     // cached blocks un-indexed to make room (or by Evict())
  uint64_t cow_copies = 0;    // BlockCopy operations handed out
  uint64_t cow_rows = 0;      // rows those copies move
  int64_t block_size = 0;
  int64_t bytes_per_token = 0;
  int64_t pool_bytes = 0;  // blocks_total x block_size x bytes_per_token
  int64_t num_sequences = 0;
};

// One tenant's part of the pool (KvCache::TenantStats).
struct TenantCacheStats {
  int64_t cached_blocks = 0;    // indexed, unowned blocks it indexed
  int64_t retained_blocks = 0;  // indexed blocks it retains (in use or not)
  uint64_t hit_tokens = 0;      // num_cached of its first admissions
  uint64_t evictions = 0;       // its cached blocks evicted
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_KV_CACHE_STATS_H_
