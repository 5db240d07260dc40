// The KV offloader: the engine's one component between the RAM pool (cache/kv_cache.h) and
// the tiers behind it, the local disk (cache/disk/disk_tier.h) and the shared Redis tier
// (cache/remote/remote_tier.h). The Scheduler batches; the offloader keeps the tiers:
//
//  - Match. After the pool's match for a waiting sequence, the offloader continues it into
//    the disk tier, then into the remote tier, whole blocks only. A request that scores its
//    prompt (prompt logprobs) takes only blocks that carry score sections, in either tier.
//    The remote tier answers on its matcher thread: the engine waits for the answer at most
//    until the step's match deadline (kMatchWait past the step's start, over all sequences),
//    then leaves the sequence parked and steps on; the answer wakes it. A slow or hung Redis
//    so costs the engine at most kMatchWait a step, whatever the tier's command timeout.
//  - Load. The blocks found are read off the engine thread: disk files (read + verify) on
//    the offloader's loader thread, remote values on the remote tier's fetcher thread. The
//    sequence is parked (the Scheduler skips it) while the others keep stepping; when both
//    parts are done the engine is woken (Options::wake) and the sequence is admitted with
//    the blocks that arrived. A block that is gone, fails verification or cannot be read,
//    and every block after it, is computed instead: a tier never decides a token.
//  - Write. After the admission's Commit, the verified bytes are written into the fresh
//    pool blocks (Backend::WriteKvBlock, on the engine thread, before the step's Forward).
//  - Publish. Full blocks the engine computed go to the remote tier, with their score
//    records when they have them.
//  - Spill. The pool's eviction hook copies an evicted block (and its score record) to the
//    disk tier's writer; at shutdown every block still cached is spilled within the grace.
//
// Threads: every method is engine-thread only (the backend is). The loader thread reads
// only the disk tier and the TierLoads it is given; a TierLoad's disk part is the loader's
// until it is marked done, then the engine thread's. Loads hold their blocks' bytes in
// memory: at most max_disk_load_blocks disk blocks are in flight at once (the remote tier
// has its own budget), and a sequence that finds the budget in use stays parked and asks
// again next step.
//
// Invariants:
//  1. A sequence has at most one TierLoad (SequenceTiers::load); while it is not done, the
//     sequence is not admitted.
//  2. A TierLoad's usable blocks are consecutive from its first block: the disk's first,
//     the remote's only when every disk block arrived, each verified against its key, root
//     and the sequence's own tokens.
//  3. The offloader outlives every TierLoad and the pool whose eviction hook calls it.
#ifndef PREFIXD_ENGINE_KV_OFFLOADER_H_
#define PREFIXD_ENGINE_KV_OFFLOADER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/disk/block_file.h"
#include "cache/disk/disk_tier.h"
#include "cache/kv_cache.h"
#include "cache/remote/remote_tier.h"
#include "cache/sha256.h"
#include "cache/token_chain.h"
#include "engine/backend.h"
#include "engine/score_store.h"

namespace prefixd {

// One load from the tiers for one waiting sequence: blocks `from` .. of its chain, the first
// disk_blocks from the disk tier, the rest from `remote`.
struct TierLoad {
  int32_t from = 0;
  int32_t disk_blocks = 0;
  bool scoring = false;  // blocks without a usable score record end the load
  // What the loader reads: the sequence's root, the chain keys of the disk blocks and their
  // tokens (block i's are tokens[i * block_size, (i + 1) * block_size)), copied so that a
  // cancelled request can go while its load runs.
  Digest root{};
  std::vector<Digest> disk_keys;
  std::vector<uint32_t> disk_tokens;

  // The disk part, the loader thread's until disk_done: the verified K/V of the first
  // disk_data.size() blocks (the loader stops at the first that fails), their score
  // sections (empty: none) and how long each read took (read + verify), in seconds.
  std::vector<std::vector<uint8_t>> disk_data;
  std::vector<std::vector<PositionScore>> disk_scores;
  std::vector<double> disk_seconds;
  std::atomic<bool> disk_done{true};

  std::shared_ptr<const RemoteFetch> remote;  // null: no remote part

  bool done() const {
    return disk_done.load(std::memory_order_acquire) && (remote == nullptr || remote->done());
  }

  // Once done, on the engine thread (KvOffloader::Resolve): the usable blocks in order.
  struct Block {
    absl::Span<const uint8_t> data;
    std::shared_ptr<const BlockScores> record;  // null: the block carries no scores
    bool from_disk = false;
    double seconds = 0;
  };
  bool resolved = false;
  std::vector<Block> blocks;
};

// The offloader's state of one sequence (engine/sequence.h holds it).
struct SequenceTiers {
  std::shared_ptr<TierLoad> load;
  // The remote tier's latest answer: remote_blocks blocks from block remote_from on
  // (scored ones only when remote_scored), answered at remote_answered. A sequence waiting
  // for room is planned again every step; within a short while the answer is reused.
  int32_t remote_from = -1;
  int32_t remote_blocks = 0;
  bool remote_scored = false;
  absl::Time remote_answered = absl::InfinitePast();
  // The match in flight (for remote_from and remote_scored), or null.
  std::shared_ptr<const RemoteMatch> match;
};

class KvOffloader {
 public:
  struct Options {
    Backend* backend = nullptr;  // not owned; engine thread only
    DiskTier* disk = nullptr;    // not owned; null: no disk tier
    RemoteTier* remote = nullptr;  // not owned; null: no remote tier
    // Not owned; null: no score records (loaded sections are then dropped, and nothing
    // scored is published).
    ScoreStore* scores = nullptr;
    uint32_t vocab_size = 0;
    // Called from the loader, fetcher or matcher thread when a load's part or a match is
    // done: the engine wakes and steps.
    std::function<void()> wake;
    // Disk blocks being read (or read and not yet written) at once, over all sequences.
    int32_t max_disk_load_blocks = 128;
  };

  explicit KvOffloader(const Options& options);
  // Stops the loader thread: a read in progress completes, loads still queued end with
  // nothing read. The tiers must still be open.
  ~KvOffloader();
  KvOffloader(const KvOffloader&) = delete;
  KvOffloader& operator=(const KvOffloader&) = delete;

  // How long one step's admissions may wait for the remote tier's match answers, in all:
  // a few of Redis's round trips on a local network.
  static constexpr absl::Duration kMatchWait = absl::Milliseconds(1);

  bool has_tiers() const { return disk_ != nullptr || remote_ != nullptr; }
  // Disk blocks loading or loaded and not yet let go of (their bytes are in memory).
  int64_t disk_blocks_in_flight() const {
    absl::MutexLock lock(&mu_);
    return disk_blocks_in_flight_;
  }

  // What the tiers hold after the pool's first `from` whole blocks of a waiting sequence.
  struct Continuation {
    bool parked = false;  // a load is running or cannot start yet: skip the sequence now
    int32_t blocks = 0;   // blocks from `from` on that a finished load holds, ready to write
  };
  // With no load yet, matches the tiers and starts one when they hold blocks (parked).
  // With a finished load, the blocks it holds from `from` on (0 when the pool's blocks no
  // longer reach the load's first block). `scoring`: score-carrying blocks only. The remote
  // tier's answer is waited for until `match_deadline` (the step's start + kMatchWait);
  // parked while it has not come.
  Continuation Continue(const TokenChain& chain, int32_t from, bool scoring,
                        absl::Time match_deadline, SequenceTiers* tiers);

  // After the admission committed: writes `count` blocks of `load` from block `first_block`
  // of the chain on into `table` (the sequence's block table). Per block its score record
  // (null: none) in `records`, and how many came from the disk; the per-block latencies
  // (load + write) are appended to disk_seconds and remote_seconds. Non-OK only for a
  // backend failure.
  struct Written {
    int32_t disk_blocks = 0;
    std::vector<std::shared_ptr<const BlockScores>> records;
  };
  absl::StatusOr<Written> Write(const TierLoad& load, int32_t first_block, int32_t count,
                                absl::Span<const int32_t> table,
                                std::vector<double>* disk_seconds,
                                std::vector<double>* remote_seconds);

  // Publishes to the remote tier the full blocks of `chain` whose last rows were computed
  // in rows [start, start + count), with the score records the store holds for them.
  void PublishComputed(const TokenChain& chain, absl::Span<const int32_t> table, int32_t start,
                       int32_t count);

  // The pool's eviction hook: queues the block (with `scores` when given) for the disk
  // tier's writer, while its rows are intact. True when it was queued (false: no disk tier,
  // the tier has it already or does not want it, or the rows could not be read).
  bool Spill(const EvictedBlock& e, const BlockScores* scores);
  // Shutdown: flushes the remote tier's publish queue, then evicts every block `cache`
  // still caches, spilling each (waiting for room in the write queue), and waits for the
  // writer; everything until `end`.
  void SpillAtShutdown(KvCache* cache, absl::Time end);

 private:
  // Starts a load of `disk_blocks` disk blocks then `remote_blocks` remote ones from block
  // `from` on. RESOURCE_EXHAUSTED: a budget is in use (ask again next step); UNAVAILABLE:
  // nothing can be loaded (compute).
  absl::Status StartLoad(const TokenChain& chain, int32_t from, int32_t disk_blocks,
                         int32_t remote_blocks, bool scoring, SequenceTiers* tiers);
  // The remote tier's blocks from block `from` on, or nullopt while its answer has not come.
  std::optional<int32_t> MatchRemote(const TokenChain& chain, int32_t from, bool scoring,
                                     absl::Time match_deadline, SequenceTiers* tiers);
  // Builds load->blocks once the load is done.
  void Resolve(const TokenChain& chain, TierLoad* load) const;
  void LoaderLoop();

  const Options options_;
  Backend* const backend_;
  DiskTier* const disk_;
  RemoteTier* const remote_;
  // Spills wait for room in the write queue until this time (shutdown); by default never.
  absl::Time spill_wait_until_ = absl::InfinitePast();

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<TierLoad>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t disk_blocks_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loader_;  // only with a disk tier
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_KV_OFFLOADER_H_
