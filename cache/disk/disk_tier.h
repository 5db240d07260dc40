// The second cache tier: KV blocks evicted from the RAM pool, kept as files in one local
// directory, read back into fresh pool blocks on a later hit, and found again after a restart.
//
// Identity is the pool's: a file holds one block under its chain key (cache/block_key.h) with
// its root key, parent key, tokens and the layout it was computed with (cache/block_record.h), and
// is checked in full before its rows may enter the pool. A file may carry the block's score section
// (prompt logprobs); its size says whether it does (layout.scored_record_bytes()), so the index
// answers "which blocks carry scores" without opening a file. A file that fails any check is
// deleted, counted (corrupt_blocks) and the engine computes the block instead: the tier never
// decides a token.
//
// A KvTier (cache/tier.h): the engine offers it the blocks the pool evicts (spills), matches
// answer at once from the index, and fetches are read on the tier's loader thread.
//
// Threads: one writer thread takes spills from a bounded queue and writes them (temporary file,
// then rename, so a reader sees a whole file or none). One loader thread reads the fetches
// (StartFetch) in order; Load and Prefetch are called from one thread at a time (that loader,
// or a test), the other methods from the engine thread, which never waits for the disk except
// in WantsSpill/Flush when given a deadline (only at shutdown); all of them share the index
// under one mutex. When the queue is full a spill is dropped and counted. Fetches hold their
// blocks' bytes in memory: at most options.max_load_blocks are in flight at once. The block
// events (options.on_store, on_delete: disk_tier_options.h) run under that mutex on whichever
// thread changed the index (Open's caller, the writer, the loader), so they come in the
// index's order.
//
// Invariants:
//  1. The index (tier_index.h) lists exactly the block files this tier wrote or found at start,
//     less those it deleted; bytes() never exceeds the cap after a write completes.
//  2. A key is queued at most once, and never while it is indexed, except to replace a file
//     without scores by one with them (no duplicate writes).
//  3. One process per directory: Open holds an exclusive flock on DIR/LOCK until destruction;
//     a second Open of the same directory (from any process) fails with FAILED_PRECONDITION.
// Files of another layout (model manifest, dtype, block size or geometry) are never loaded;
// they count against the cap and are the first to be deleted. Files other than *.kvb (and the
// tier's own *.tmp leftovers, deleted at start) are left alone.
//  4. Nothing outside the directory is written or deleted through it: only regular files are
//     indexed; block files are created anew (base/file.h: O_EXCL|O_NOFOLLOW, then renamed
//     over a link, never through it); deleting a link removes the link; DIR/LOCK is opened
//     O_NOFOLLOW and written only as a regular file with no other name. The directory must
//     belong to this user (or root) and be writable by no one else, or Open refuses it, as
//     ssh refuses a loose ~/.ssh.
//  5. With on_store and on_delete set, their calls since Open, replayed in order, give
//     exactly the index's own entries: a key is stored once while indexed (a replacement with
//     a score section is not a second store), deleted once when it leaves, and never
//     reported before it is indexed or after it left.
#ifndef PREFIXD_CACHE_DISK_DISK_TIER_H_
#define PREFIXD_CACHE_DISK_DISK_TIER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/block_record.h"
#include "cache/digest_hash.h"
#include "cache/disk/disk_tier_options.h"
#include "cache/disk/disk_tier_stats.h"
#include "cache/disk/tier_index.h"
#include "cache/tier.h"

namespace prefixd {

class DiskTier final : public KvTier {
 public:
  // Creates the directory if needed, takes its lock, rebuilds the index from the *.kvb files
  // (this layout's by name; others as foreign), deletes *.tmp leftovers and enforces the cap;
  // with options.on_store, then reads each file's head and reports it (parents first).
  // INVALID_ARGUMENT for a bad layout or options; FAILED_PRECONDITION with what to fix when the
  // directory cannot be created or written, is writable by group or others or owned by another
  // user (invariant 4), or another process holds its lock.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options,
                                                        const BlockLayout& layout);
  // Stops the writer and the loader: a write or read in progress completes, queued spills are
  // dropped (counted), queued fetches end with nothing read.
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // How many of `keys` (chain keys of consecutive blocks, as a TokenChain holds them:
  // cache/token_chain.h) the tier holds, counted from the first to the first it does not hold.
  // Hashes nothing: the keys are the request's own.
  size_t MatchFrom(absl::Span<const Digest> keys) const;
  // The same, counting only files that carry a score section.
  size_t MatchScoredFrom(absl::Span<const Digest> keys) const;
  bool Contains(const Digest& key) const;

  // Asks the kernel to start reading the files of `keys` (posix_fadvise WILLNEED), so that
  // the Loads that follow find them in the page cache instead of waiting for the device one
  // file at a time. Best effort; absent files are skipped.
  void Prefetch(absl::Span<const Digest> keys) const;

  // Reads the block `expect.key` and verifies it (cache/block_record.h) into `out`
  // (layout().data_bytes() bytes) and, when given, its score section into `scores` (empty
  // when the file has none). NOT_FOUND when absent (also when the writer deleted it a
  // moment ago); DATA_LOSS when it failed verification: the file is deleted and counted.
  absl::Status Load(const BlockExpectation& expect, absl::Span<uint8_t> out,
                    std::vector<PositionScore>* scores = nullptr);

  // Whether a spill of `key` (with a score section when `spill.scored`) should be built and
  // queued now: false when the key is queued already or on disk (unless only a file without
  // scores is, and this spill has them), and false (counted as dropped) when the queue is
  // full — after waiting for room until `spill.deadline` (the default never waits). The
  // engine thread is the only producer, so room found here is still there for the Spill that
  // follows.
  struct SpillIntent {
    bool scored = false;
    absl::Time deadline = absl::InfinitePast();
  };
  bool WantsSpill(const Digest& key, const SpillIntent& spill);
  bool WantsSpill(const Digest& key) { return WantsSpill(key, SpillIntent{}); }
  // Queues a block WantsSpill accepted (PREFIXD_CHECKs its sizes and the room).
  void Spill(BlockRecord record);
  // Waits until every queued spill is written (true) or `deadline` passes (false).
  bool Flush(absl::Time deadline) override;

  // KvTier. A match is answered from the index before StartMatch returns (on_done is not
  // called). A fetch is read on the loader thread (Prefetch, then Load block by block),
  // stopping at the first block that fails, or has no score section when request.scored_only,
  // or when nobody holds the fetch any more.
  TierMedium medium() const override { return TierMedium::kDisk; }
  TierOffers offers() const override { return TierOffers::kEvicted; }
  absl::StatusOr<std::shared_ptr<const TierMatch>> StartMatch(
      absl::Span<const Digest> keys, const MatchOptions& match,
      std::function<void()> on_done) override;
  absl::Duration match_reuse() const override { return absl::ZeroDuration(); }
  absl::StatusOr<std::shared_ptr<const TierFetch>> StartFetch(
      FetchRequest request, std::function<void()> on_done) override;
  int32_t max_fetch_blocks() const override { return max_load_blocks_; }
  // Reading a file is several times cheaper than computing its block (bench/disk_tier_bench).
  bool wait_capped_at_compute() const override { return false; }
  // Blocks of fetches reading or read and not yet let go of (their bytes are in memory).
  int64_t fetch_blocks_in_flight() const {
    absl::MutexLock lock(&load_mu_);
    return fetch_blocks_in_flight_;
  }
  bool WantsOffer(const Digest& key, const OfferIntent& offer) override {
    return WantsSpill(key, {.scored = offer.scored, .deadline = offer.deadline});
  }
  std::vector<uint8_t> OfferBuffer() override {
    return std::vector<uint8_t>(static_cast<size_t>(layout_.data_bytes()));
  }
  void Offer(BlockRecord record) override { Spill(std::move(record)); }

  DiskTierStats Stats() const;
  const BlockLayout& layout() const override { return layout_; }
  int64_t cap_bytes() const { return cap_; }
  const std::string& dir() const { return dir_; }
  // The file that holds (or would hold) `key`: DIR/<layout id>-<hex key>.kvb.
  std::string PathOf(const Digest& key) const;

 private:
  DiskTier(const DiskTierOptions& options, const BlockLayout& layout, int lock_fd, int64_t cap);
  absl::Status Scan();
  void WriterLoop();
  void LoaderLoop();
  // Reads f's blocks (the loader thread's part of a fetch).
  void Read(TierFetch& f, const std::shared_ptr<TierFetch>& held);
  // Whether `key` is indexed with a score section. Requires mu_.
  bool ScoredLocked(const Digest& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes index victims until `incoming` more bytes fit. Requires mu_.
  void MakeRoomLocked(int64_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Open's part of on_store: reads and checks the head of every indexed file (deleting and
  // counting those that fail) and reports the others, parents first. Requires mu_.
  void ReportFoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // on_delete for an own file that left the index, once Open reported what it found (a file
  // deleted before was never reported stored). Requires mu_.
  void ReportDeletedLocked(const Digest& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t Now() const { return clock_(); }

  const std::string dir_;
  const BlockLayout layout_;
  const std::string layout_id_;
  const int32_t max_queued_;
  const std::function<int64_t()> clock_;
  const std::function<int(const std::string&, const std::string&, std::string_view)> write_file_;
  const std::function<void()> read_hook_;
  const std::function<void(const BlockRecordHead&)> on_store_;
  const std::function<void(const Digest&)> on_delete_;
  const int lock_fd_;
  const int64_t cap_;
  const int32_t max_load_blocks_;

  mutable absl::Mutex mu_;
  TierIndex index_ ABSL_GUARDED_BY(mu_);
  std::deque<BlockRecord> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Digest, DigestHash> queued_keys_ ABSL_GUARDED_BY(mu_);  // incl. writing
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool found_reported_ ABSL_GUARDED_BY(mu_) = false;  // Open's scan is done
  DiskTierStats stats_ ABSL_GUARDED_BY(mu_);

  std::string load_buffer_;  // the loading thread's: the file being verified
  std::thread writer_;

  struct PendingFetch {
    std::shared_ptr<TierFetch> fetch;
    std::function<void()> on_done;
  };
  mutable absl::Mutex load_mu_;
  std::deque<PendingFetch> fetches_ ABSL_GUARDED_BY(load_mu_);
  int64_t fetch_blocks_in_flight_ ABSL_GUARDED_BY(load_mu_) = 0;
  bool loader_stop_ ABSL_GUARDED_BY(load_mu_) = false;
  std::thread loader_;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_DISK_DISK_TIER_H_
