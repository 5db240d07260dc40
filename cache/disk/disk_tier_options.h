// DiskTierOptions: how a disk tier (cache/disk/disk_tier.h) is opened. Apart from the tier so
// that whoever only configures one (EngineOptions) compiles none of its threads and locks.
#ifndef PREFIXD_CACHE_DISK_DISK_TIER_OPTIONS_H_
#define PREFIXD_CACHE_DISK_DISK_TIER_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "cache/sha256.h"

namespace prefixd {

// cache/block_record.h. Declared only: whoever configures a tier (EngineOptions, the front
// ends) does not see the record format (tests/include_rules_test.cc).
struct BlockRecordHead;

inline constexpr int64_t kDefaultDiskTierMaxBytes = int64_t{8} << 30;

// dir and max_bytes are prefixd flags (--cache-dir, --cache-dir-bytes); DiskTier::Open checks
// them, naming the flag.
struct DiskTierOptions {
  std::string dir;  // created (with its parents) when absent
  // Cap on the bytes of block files in `dir`. 0: the smaller of 8 GiB and half the free space
  // of dir's filesystem at Open (cap_bytes() says which).
  int64_t max_bytes = 0;
  // Spills waiting for the writer; more are dropped. 64 blocks of full GPT-2 fp32 is ~75 MB.
  int32_t max_queued_blocks = 64;
  // Blocks being read (or read and not yet taken by their request) at once, over all
  // fetches: their K/V wait in memory.
  int32_t max_load_blocks = 128;
  // LRU time in nanoseconds; default the wall clock (file mtimes order blocks after a restart).
  std::function<int64_t()> clock;
  // How the writer thread writes a block file: base/file.h's WriteFileAtomically (0 or an
  // errno) unless set. The one seam to the file system's write side, as leveldb's Env is, so
  // that a slow or failing disk can be put under the tier.
  std::function<int(const std::string& tmp, const std::string& path, std::string_view bytes)>
      write_file;
  // Runs before each Load reads its file, on the loading thread; unset in production. The
  // seam to the read side, as write_file is to the write side: tests hold loads back with it
  // to see what the engine does meanwhile.
  std::function<void()> read_hook;

  // The tier's block events, for the engine's KV events (engine/kv_events.h); unset: none.
  // on_store runs for each block file of this layout that enters the index: at Open for every
  // file found there, once its head (cache/block_record.h) is read and checked (a file whose
  // head fails is deleted and counted as corrupt, and reported nowhere), parents before
  // children, on the thread calling Open; then on the writer thread for each file written
  // (never for a spill dropped or a write that failed, nor when a file with a score section
  // replaces one without: that block was indexed all along). on_delete runs for each indexed
  // file of this layout that leaves the index after Open (the cap, a failed verification, a
  // file found gone, a failed replacement), on the thread that removed it. Files of another
  // layout are not this model's blocks: neither runs for them. Both run under the tier's lock,
  // in the order the index changed: they must be quick and must not call the tier. Open reads
  // the heads only when on_store is set (one small read per file).
  std::function<void(const BlockRecordHead& head)> on_store;
  std::function<void(const Digest& key)> on_delete;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_DISK_DISK_TIER_OPTIONS_H_
