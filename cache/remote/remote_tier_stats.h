// RemoteTierStats: the counters of a remote tier (cache/remote/remote_tier.h), for stats
// snapshots.
#ifndef PREFIXD_CACHE_REMOTE_REMOTE_TIER_STATS_H_
#define PREFIXD_CACHE_REMOTE_REMOTE_TIER_STATS_H_

#include <cstdint>

namespace prefixd {

struct RemoteTierStats {
  bool configured = false;  // a remote tier exists
  bool up = false;          // the last command on either connection succeeded
  int64_t queued_blocks = 0;
  uint64_t stores = 0;          // blocks published (SET answered OK)
  uint64_t stores_dropped = 0;  // offered but not published: queue full, tier down, an error
  uint64_t loads = 0;           // blocks read, verified and handed to the pool
  uint64_t corrupt_blocks = 0;  // values that failed verification (deleted; recomputed)
  // Faults by operation: connecting (incl. AUTH/SELECT), matching, loading, storing.
  uint64_t connect_errors = 0;
  uint64_t match_errors = 0;
  uint64_t load_errors = 0;
  uint64_t store_errors = 0;
  // Matches not answered by their deadline (MatchTimeout: in the matcher's queue or on the
  // wire), each a miss whose blocks are computed.
  uint64_t match_timeouts = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_REMOTE_REMOTE_TIER_STATS_H_
