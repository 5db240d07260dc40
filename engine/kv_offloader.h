// The KV offloader: the engine's one component between the RAM pool (cache/kv_cache.h) and
// the tiers behind it (cache/tier.h: the local disk, cache/disk/disk_tier.h, then the shared
// Redis tier, cache/remote/remote_tier.h, as engine/kv_tiers.cc builds them). It knows no
// tier by kind: it walks the list in order. The Scheduler batches; the offloader keeps the
// tiers:
//
//  - Match. After the pool's match for a waiting sequence, the offloader continues it into
//    each tier in turn, whole blocks only, each tier from where the one before it stopped. A
//    request that scores its prompt (prompt logprobs) takes only blocks that carry score
//    sections. A tier answers on its own thread (or at once): the engine waits for the
//    answers at most until the step's match deadline (kMatchWait past the step's start, over
//    all sequences), then leaves the sequence parked and steps on; the answer wakes it. A
//    slow or hung tier so costs the engine at most kMatchWait a step.
//  - Load. The blocks found are fetched off the engine thread, each tier's part on that
//    tier's thread, all parts at once. The sequence is parked (the Scheduler skips it) while
//    the others keep stepping; when every part is done the engine is woken (Options::wake)
//    and the sequence is admitted with the blocks that arrived. A block that is gone, fails
//    verification or cannot be read, and every block after it (in its tier and the later
//    ones), is computed instead: a tier never decides a token.
//    A load is not worth waiting for longer than computing its tokens would take: when one
//    of its tiers asks for it (KvTier::wait_capped_at_compute: the remote tier), its wait is
//    capped at its tokens times the engine's measured compute time per token (ComputeRate),
//    and at least kMinCappedWait; past it the sequence takes the parts done by then (in
//    order) and computes the rest, while the tiers end the fetches on their own threads.
//  - Write. After the admission's Commit, the verified bytes are written into the fresh
//    pool blocks (Backend::WriteKvBlock, on the engine thread, before the step's Forward).
//  - Offer. Full blocks the engine computed go to the tiers that take computed blocks (the
//    remote tier publishes them), blocks the pool evicts to those that take evicted ones (the
//    disk tier spills them), with their score records when they have them; at shutdown every
//    block still cached is evicted, and so offered, within the grace.
//
// Threads: every method is engine-thread only (the backend is). Loads hold their blocks'
// bytes in memory: each tier bounds its own fetches (KvTier::max_fetch_blocks), and a
// sequence that finds a budget in use stays parked and asks again next step.
//
// Invariants:
//  1. A sequence has at most one TierLoad (SequenceTiers::load); while it is neither done nor
//     past its wait cap, the sequence is not admitted.
//  2. A TierLoad's usable blocks are consecutive from its first block: a tier's part's from
//     its first, a later tier's only when every block of the parts before it arrived, each
//     verified against its key, root and the sequence's own tokens.
//  3. The offloader outlives every TierLoad and the pool whose eviction hook calls it; the
//     tiers outlive the offloader.
#ifndef PREFIXD_ENGINE_KV_OFFLOADER_H_
#define PREFIXD_ENGINE_KV_OFFLOADER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/block_record.h"
#include "cache/kv_cache.h"
#include "cache/sha256.h"
#include "cache/tier.h"
#include "cache/token_chain.h"
#include "engine/backend.h"
#include "engine/score_store.h"

namespace prefixd {

// One load from the tiers for one waiting sequence: blocks `from` .. of its chain, one part
// per tier that holds some, in the tiers' order (part i's blocks follow part i - 1's).
struct TierLoad {
  int32_t from = 0;
  bool scoring = false;  // blocks without a usable score record end the load
  // Past it the load is not waited for (computing its blocks costs less).
  absl::Time wait_until = absl::InfiniteFuture();
  struct Part {
    TierMedium medium = TierMedium::kDisk;
    int32_t blocks = 0;  // asked for
    std::shared_ptr<const TierFetch> fetch;
  };
  std::vector<Part> parts;

  bool done() const {
    return std::all_of(parts.begin(), parts.end(), [](const Part& p) { return p.fetch->done(); });
  }

  // Once done or past wait_until, on the engine thread (KvOffloader::Resolve): the usable
  // blocks in order, from the parts done by then.
  struct Block {
    absl::Span<const uint8_t> data;
    std::shared_ptr<const BlockScores> record;  // null: the block carries no scores
    TierMedium medium = TierMedium::kDisk;
    double seconds = 0;
  };
  bool resolved = false;
  std::vector<Block> blocks;
};

// The offloader's state of one sequence (engine/sequence.h holds it, forward-declared).
struct SequenceTiers {
  std::shared_ptr<TierLoad> load;
  // The latest lookup found blocks but a tier's fetch budget was in use: parked, to ask again.
  bool budget_refused = false;
  // Per tier, in the offloader's order: its latest answer, `blocks` blocks from block `from`
  // on (scored ones only when `scored`), answered at `answered`, reused for the tier's
  // match_reuse(); and the match in flight (for `from` and `scored`), or null.
  struct Answer {
    int32_t from = -1;
    int32_t blocks = 0;
    bool scored = false;
    absl::Time answered = absl::InfinitePast();
    std::shared_ptr<const TierMatch> match;
  };
  std::vector<Answer> answers;
};

// A running estimate of what computing a token costs this engine: the forward passes'
// duration per token, averaged (exponentially, the latest weighing 1/4) over the steps that
// prefilled at least kMinPrefillTokens.
class ComputeRate {
 public:
  static constexpr int64_t kMinPrefillTokens = 16;
  // One forward of `tokens` tokens, `prefill_tokens` of them prefill, that took `took`.
  void Observe(int64_t prefill_tokens, int64_t tokens, absl::Duration took);
  // Zero until a step was observed.
  absl::Duration PerToken() const { return per_token_; }

 private:
  absl::Duration per_token_ = absl::ZeroDuration();
};

class KvOffloader {
 public:
  struct Options {
    Backend* backend = nullptr;  // not owned; engine thread only
    // Not owned, in lookup order (disk, then remote); outlive the offloader. Empty: none.
    std::vector<KvTier*> tiers;
    // Not owned; null: no score records (loaded sections are then dropped, and nothing
    // scored is offered).
    ScoreStore* scores = nullptr;
    uint32_t vocab_size = 0;
    // Called from a tier's thread when a load's part or a match is done: the engine wakes
    // and steps.
    std::function<void()> wake;
    // What computing one token costs, for the cap on a load's wait; injected by tests.
    // Unset: the rate measured from ObserveForward. Zero: not known yet (no cap).
    std::function<absl::Duration()> compute_per_token = nullptr;
    // The clock of the cap on a load's wait; injected by tests. Unset: absl::Now.
    std::function<absl::Time()> clock = nullptr;
  };

  explicit KvOffloader(const Options& options);
  KvOffloader(const KvOffloader&) = delete;
  KvOffloader& operator=(const KvOffloader&) = delete;

  // How long one step's admissions may wait for the tiers' match answers, in all: a few of
  // Redis's round trips on a local network.
  static constexpr absl::Duration kMatchWait = absl::Milliseconds(1);
  // A capped load is still waited for this long: the rate is measured on whole prefills, and
  // a tier's answer within this is within a loaded machine's hiccup (a wrong guess here
  // costs a recomputation).
  static constexpr absl::Duration kMinCappedWait = absl::Milliseconds(100);

  bool has_tiers() const { return !options_.tiers.empty(); }
  // Loads whose wait was cut at the compute time of their tokens (ComputeRate).
  uint64_t waits_cut() const { return waits_cut_; }

  // After each forward: `tokens` tokens, `prefill_tokens` of them prefill, took `took`.
  void ObserveForward(int64_t prefill_tokens, int64_t tokens, absl::Duration took) {
    rate_.Observe(prefill_tokens, tokens, took);
  }

  // What the tiers hold after the pool's first `from` whole blocks of a waiting sequence.
  struct TierLookup {
    bool parked = false;       // a load is running or cannot start yet: skip the sequence now
    int32_t ready_blocks = 0;  // blocks from `from` on that a finished load holds, to write
    std::shared_ptr<const TierLoad> load = nullptr;  // that load, when ready_blocks > 0
  };
  // Whether the sequence whose offloader state is `tiers` (may be null) waits on the tiers:
  // for a tier's match answer still in flight, for a load neither done nor past its wait,
  // or, at its latest lookup, for a fetch budget in use. LookUpTiers would then park it
  // again this step (or, for an answer or the budget, probably would). Without side effects
  // (no match, no load started), for planning a step before admissions.
  bool WaitsOnTiers(const SequenceTiers* tiers) const;
  // With no load yet, matches the tiers and starts one when they hold blocks (parked).
  // With a finished load (or one past its wait cap: its parts done by then), the blocks it
  // holds from `from` on (0 when the pool's blocks no
  // longer reach the load's first block). `scoring`: score-carrying blocks only. Match
  // answers are waited for until `match_deadline` (the step's start + kMatchWait); parked
  // while one has not come. Creates *tiers when null.
  TierLookup LookUpTiers(const TokenChain& chain, int32_t from, bool scoring,
                         absl::Time match_deadline, std::shared_ptr<SequenceTiers>* tiers);

  // After the admission committed: writes `count` blocks of `load` from block `first_block`
  // of the chain on into `table` (the sequence's block table). Per block: its tier's medium,
  // its latency (load + write) in seconds and its score record (null: none). Non-OK only for
  // a backend failure.
  struct WrittenBlock {
    TierMedium medium = TierMedium::kDisk;
    double seconds = 0;
    std::shared_ptr<const BlockScores> record;
  };
  absl::StatusOr<std::vector<WrittenBlock>> Write(const TierLoad& load, int32_t first_block,
                                                  int32_t count, absl::Span<const int32_t> table);

  // Offers the tiers that take computed blocks the full blocks of `chain` whose last rows
  // were computed in rows [start, start + count), with the score records the store holds.
  void OfferComputed(const TokenChain& chain, absl::Span<const int32_t> table, int32_t start,
                     int32_t count);

  // The pool's eviction hook: offers the block (with `scores` when given) to the tiers that
  // take evicted blocks, while its rows are intact. True when one took it (false: no such
  // tier, they have it already or do not want it, or the rows could not be read).
  bool OfferEvicted(const EvictedBlock& e, const BlockScores* scores);
  // Shutdown: flushes the tiers that take computed blocks, then evicts every block `cache`
  // still caches, offering each (waiting for room in the tiers' queues), and flushes the
  // tiers that take evicted ones; everything until `end`.
  void SpillAtShutdown(KvCache* cache, absl::Time end);

 private:
  // Starts a load of found[i] blocks from tier i, the parts one after the other from block
  // `from` on. RESOURCE_EXHAUSTED: the first part's budget is in use (ask again next step);
  // UNAVAILABLE: nothing can be loaded (compute).
  absl::Status StartLoad(const TokenChain& chain, int32_t from, absl::Span<const int32_t> found,
                         bool scoring, SequenceTiers* tiers);
  // Tier i's blocks from block `from` on, or nullopt while its answer has not come.
  std::optional<int32_t> Match(size_t i, const TokenChain& chain, int32_t from, bool scoring,
                               absl::Time match_deadline, SequenceTiers::Answer* answer);
  // Builds load->blocks once the load is done.
  void Resolve(const TokenChain& chain, TierLoad* load) const;

  const Options options_;
  Backend* const backend_;
  const std::function<absl::Time()> clock_;
  std::vector<KvTier*> computed_tiers_;  // the tiers offered computed blocks
  std::vector<KvTier*> evicted_tiers_;   // ... and evicted ones
  // Evicted blocks wait for room in a tier's queue until this time (shutdown); by default
  // never.
  absl::Time offer_wait_until_ = absl::InfinitePast();
  ComputeRate rate_;
  uint64_t waits_cut_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_KV_OFFLOADER_H_
