// DiskTierStats: the counters of a disk tier (cache/disk/disk_tier.h), for stats snapshots.
#ifndef PREFIXD_CACHE_DISK_DISK_TIER_STATS_H_
#define PREFIXD_CACHE_DISK_DISK_TIER_STATS_H_

#include <cstdint>

namespace prefixd {

struct DiskTierStats {
  int64_t blocks = 0;         // block files of this layout in the index
  int64_t bytes = 0;          // bytes of every indexed file, this layout's and foreign ones
  int64_t foreign_files = 0;  // files of other layouts still on disk
  int64_t cap_bytes = 0;
  int64_t queued_blocks = 0;    // spills waiting for the writer or being written
  uint64_t spills = 0;          // blocks written to disk
  uint64_t spills_dropped = 0;  // offered but not written: queue full, write error, shutdown
  uint64_t write_errors = 0;    // of those, failed writes (disk full, I/O error)
  uint64_t loads = 0;           // blocks read, verified and handed to the pool
  uint64_t corrupt_blocks = 0;  // files that failed verification (deleted; recomputed)
  uint64_t evicted_files = 0;   // files deleted to stay under the cap
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_DISK_DISK_TIER_STATS_H_
