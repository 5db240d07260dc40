// The one interface of a cache tier behind the RAM pool: a store of block records
// (cache/block_record.h) that the engine's offloader (engine/kv_offloader.h) matches into,
// fetches from and offers blocks to, without knowing what the tier is. The local disk
// (cache/disk/disk_tier.h) and the shared Redis tier (cache/remote/remote_tier.h) derive from
// it; the engine builds its tiers in one place (engine/kv_tiers.cc) and walks them in order.
//
// Every tier owns its threads: a match and a fetch are started on the engine thread and
// answered on the tier's own (or at once, when answering costs nothing), the engine is told
// through the `on_done` callback, and an offered block is written by the tier's writer. The
// engine thread never waits on a tier's store, except in Flush and in WantsOffer when given a
// deadline (only at shutdown).
//
// Identity is the pool's: a tier holds a block under its chain key (cache/block_key.h), and
// every fetched block is verified in full against the request's root, key and tokens before
// its rows may enter the pool; one that fails is dropped (counted by the tier), and it and
// every block after it are computed: a tier never decides a token.
#ifndef PREFIXD_CACHE_TIER_H_
#define PREFIXD_CACHE_TIER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/block_record.h"
#include "cache/sha256.h"

namespace prefixd {

// What kind of store a tier is: usage by source (EngineRequest's Usage), the load latency
// histograms and the KV events of the engine are kept by it.
enum class TierMedium { kDisk, kRemote };

// Which blocks a tier is offered: those the pool evicts (a spill, while their rows are still
// intact), or every full block the engine computes (a publish, so that other replicas find
// them).
enum class TierOffers { kEvicted, kComputed };

// One match (KvTier::StartMatch). The engine thread polls done() or waits a bounded while
// (WaitFor); after it, blocks is the tier's answer and no longer changes.
struct TierMatch {
  std::vector<Digest> keys;  // chain keys of consecutive blocks
  bool scored_only = false;
  // Past it an answer is not waited for: the match counts as a miss (0 blocks).
  absl::Time deadline = absl::InfiniteFuture();

  bool done() const { return done_.HasBeenNotified(); }
  // True once done, waiting at most `timeout`.
  bool WaitFor(absl::Duration timeout) const {
    return done_.WaitForNotificationWithTimeout(timeout);
  }
  // After done(): how many of keys the tier holds, from the first to the first it does not
  // hold (0 when the tier failed, timed out or was stopping).
  size_t blocks = 0;

  absl::Notification done_;
};

// Blocks fetched for one request, off the engine thread (KvTier::StartFetch). The engine
// thread polls done(); after it, the results are the tier's and no longer change.
struct TierFetch {
  // What the tier fetches: the request's root, the chain keys of the blocks and their tokens
  // (block i's are tokens[i * block_size, (i + 1) * block_size)).
  Digest root{};
  std::vector<Digest> keys;
  std::vector<uint32_t> tokens;
  // Only blocks with a score section are of use: the fetch may stop at the first without.
  bool scored_only = false;
  // Blocks not in by then are not waited for (InfiniteFuture: the tier has no such bound).
  absl::Time deadline = absl::InfiniteFuture();

  bool done() const { return done_.load(std::memory_order_acquire); }
  // After done(): the verified K/V of the first data.size() blocks (the fetch stops at the
  // first block that is gone, fails verification or cannot be read), their score sections
  // (empty for a record without one) and how long each took (read + verify), in seconds.
  // Each block's K/V is a span of values[i], the buffer the tier read it into.
  std::vector<absl::Span<const uint8_t>> data;
  std::vector<std::vector<uint8_t>> values;
  std::vector<std::vector<PositionScore>> scores;
  std::vector<double> seconds;

  std::atomic<bool> done_{false};
};

class KvTier {
 public:
  virtual ~KvTier() = default;

  virtual TierMedium medium() const = 0;
  virtual TierOffers offers() const = 0;
  virtual const BlockLayout& layout() const = 0;

  // Starts a match: how many of `keys` (chain keys of consecutive blocks, as a TokenChain
  // holds them) the tier holds, counted from the first to the first it does not hold; with
  // `scored_only`, only records with a score section. `on_done` runs once it is answered (on
  // the tier's thread; not at all when the answer is ready on return). UNAVAILABLE while the
  // tier cannot answer (down, backing off, stopping): the caller computes.
  struct MatchOptions {
    bool scored_only = false;
  };
  virtual absl::StatusOr<std::shared_ptr<const TierMatch>> StartMatch(
      absl::Span<const Digest> keys, const MatchOptions& match, std::function<void()> on_done) = 0;
  // How long an answer stays good for the same question: a waiting request is matched again
  // every step, and a tier whose answers cost a round trip reuses them this long. Zero: ask
  // every time.
  virtual absl::Duration match_reuse() const = 0;

  // Starts fetching the blocks of `request` (at most max_fetch_blocks()); `on_done` runs on
  // the tier's thread once the fetch is done. The fetch's blocks count against that budget
  // until the returned object is destroyed (their K/V are held in memory until then).
  // RESOURCE_EXHAUSTED while the budget has no room (ask again later); UNAVAILABLE while the
  // tier cannot fetch (compute the blocks).
  struct FetchRequest {
    Digest root{};
    std::vector<Digest> keys = {};
    std::vector<uint32_t> tokens = {};
    bool scored_only = false;
  };
  virtual absl::StatusOr<std::shared_ptr<const TierFetch>> StartFetch(
      FetchRequest request, std::function<void()> on_done) = 0;
  virtual int32_t max_fetch_blocks() const = 0;
  // Whether a fetch is waited for only as long as computing its blocks would take (the
  // engine then computes them and lets the fetch end on the tier's thread): for a tier whose
  // fetches may cost more than computing, a remote one. A local disk is always waited for.
  virtual bool wait_capped_at_compute() const = 0;

  // Whether a block (with a score section when `offer.scored`) should be built and offered
  // now: false when the tier has it or has it queued (unless only without scores, and this
  // one has them), is down, or (counted as dropped) when its queue is full — after waiting
  // for room until `offer.deadline` where the tier can wait (the default never waits).
  struct OfferIntent {
    bool scored = false;
    absl::Time deadline = absl::InfinitePast();
  };
  virtual bool WantsOffer(const Digest& key, const OfferIntent& offer) = 0;
  // A buffer for the K/V of a block to offer (layout().data_bytes() long, its contents
  // unspecified).
  virtual std::vector<uint8_t> OfferBuffer() = 0;
  // Queues a block WantsOffer accepted (PREFIXD_CHECKs its sizes).
  virtual void Offer(BlockRecord record) = 0;
  // Waits until every offered block is written (true) or `deadline` passes (false).
  virtual bool Flush(absl::Time deadline) = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_CACHE_TIER_H_
