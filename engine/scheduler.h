// The scheduler: continuous batching over one KvCache and one Backend. Engine-thread only
// (engine.cc runs it); it has no locks and no threads, so tests can drive it step by step.
//
// Each Step() builds one batch:
//  1. every running sequence with one token left to compute (a decode) gets it, oldest
//     admission first; when the pool cannot hold a block for it even after eviction, the
//     most recently admitted sequence is preempted by recompute (blocks released, full ones
//     stay cached; requeued at the front);
//  2. sequences still prefilling get chunks in admission order from what is left of
//     max_batch_tokens, so a long prompt delays running decodes by at most one chunk;
//  3. waiting requests are admitted in order while budget and blocks remain. One whose
//     prefix another running sequence is computing right now waits for those blocks
//     instead of computing them twice. With a disk tier, the prefix match continues into it
//     after the pool's match ends, and with a remote tier into that after the disk's: the
//     whole blocks they hold are admitted as blocks to load (for a request with prompt
//     logprobs, only disk blocks whose files carry score sections, and no remote ones).
//     Remote blocks are fetched first, off this thread: the request is parked (skipped by
//     admission) until its fetch is done, while the others keep running; then it is
//     admitted with the blocks fetched.
// Then the copies cache/ asked for run, the tier blocks are written into the admitted
// sequences' fresh blocks (disk blocks read synchronously, on this thread; a block that is
// gone, fails verification or could not be fetched, and every one after it, are computed
// instead), the backend runs the batch, computed rows are marked (full blocks become
// shareable, and are published to the remote tier), and tokens are sampled and streamed.
//
// Invariants: every request in the scheduler ends with exactly one kDone; a finished or
// preempted sequence holds no KvCache sequence; a backend error ends every request that was
// running (INTERNAL, the backend's message) and leaves the pool consistent.
#ifndef PREFIXD_ENGINE_SCHEDULER_H_
#define PREFIXD_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache/disk/disk_tier.h"
#include "cache/kv_cache.h"
#include "cache/remote/remote_tier.h"
#include "engine/backend.h"
#include "engine/engine_stats.h"
#include "engine/model_config.h"
#include "engine/score_store.h"
#include "engine/sequence.h"

namespace prefixd {

struct SchedulerOptions {
  Backend* backend = nullptr;  // not owned
  KvCache* cache = nullptr;    // not owned
  ModelConfig model_config;
  int32_t max_batch_tokens = 512;
  std::function<absl::Time()> clock;  // required
  DiskTier* disk_tier = nullptr;      // not owned; null: no disk tier
  RemoteTier* remote_tier = nullptr;  // not owned; null: no remote tier
  // Called from another thread when a remote fetch is done: the engine wakes and steps.
  std::function<void()> wake;
  // Not owned; null: no score records are kept (prompt logprobs are then always computed).
  ScoreStore* scores = nullptr;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a validated request at the back. `request->root` must be set.
  void Enqueue(std::unique_ptr<RequestState> request);
  // Ends (CANCELLED) every request whose stream asked to cancel, and finishes (kStop) every
  // sample a stream asked to stop, releasing their blocks.
  void HandleCancellations();
  // One batch (see above). Returns false when nothing could run (no batch was formed).
  bool Step();
  // Pushes the events of the calls above to their streams and forgets ended requests.
  // Separate so the engine can publish counters first: once a caller sees kDone, Stats()
  // already include that request.
  void FlushEvents();
  // Ends every remaining request with `status` (non-OK), releasing their blocks.
  void EndAll(const absl::Status& status);

  bool idle() const { return requests_.empty(); }  // after FlushEvents()
  // The first fatal device error the backend returned (IsFatalDeviceError); OK until then.
  const absl::Status& fatal_error() const { return fatal_error_; }
  const SchedulerCounters& counters() const { return counters_; }
  // Latency observations (seconds) since the last call.
  void DrainLatencies(std::vector<double>* ttft, std::vector<double>* tpot,
                      std::vector<double>* disk_load, std::vector<double>* remote_load);
  // Per-adapter prompt token counts since the last call, added into `out`.
  void DrainAdapterTokens(AdapterTokenCounts* out);

 private:
  struct Scheduled {
    Sequence* seq;
    int32_t start;  // num_computed before the step
    int32_t count;  // tokens forwarded
    bool decode;
    bool all_logits = false;  // a prompt chunk of a request with prompt_logprobs
  };

  // Blocks an admission found in the tiers: blocks first_block .. first_block + count - 1
  // of seq's chain, to be read into its (fresh) blocks before the step's Forward; the first
  // disk_count of them from the disk tier, the rest from `fetched` (its blocks from
  // fetched_offset on).
  struct DiskLoad {
    Sequence* seq;
    int32_t first_block;
    int32_t count;
    int32_t disk_count;
    bool first_admission;
    bool scoring;  // files with score sections only; their records score the positions
    std::shared_ptr<const RemoteFetch> fetched;
    int32_t fetched_offset = 0;
  };

  void Admit(std::vector<Scheduled>* batch, int32_t* budget);
  // How many disk blocks continue `seq`'s match after the pool's first `pool_blocks` blocks;
  // the scored one counts only files with score sections (a scoring request's).
  int32_t DiskMatch(const Sequence* seq, int32_t pool_blocks) const;
  int32_t ScoredDiskMatch(const Sequence* seq, int32_t pool_blocks) const;
  // How many remote blocks continue `seq`'s match from block `from` on (reusing the
  // sequence's latest answer when it is fresh).
  int32_t RemoteMatch(Sequence* seq, int32_t from);
  // Starts fetching `count` remote blocks of `seq` from block `from` on (at most the tier's
  // fetch budget of them). OK: started; RESOURCE_EXHAUSTED: the budget is in use, ask again
  // next step; UNAVAILABLE: the tier is down, compute instead.
  absl::Status StartRemoteFetch(Sequence* seq, int32_t from, int32_t count);
  // Publishes to the remote tier the full blocks that `s`'s computed rows completed.
  void PublishComputed(const Scheduled& s);
  // Reads the blocks of pending_loads_ into the pool, marks them computed, restores their
  // score records, and moves each batch entry's start past what was loaded. A scoring
  // admission that loaded nothing after shared pool blocks goes back to the queue (its
  // entry leaves the batch). Non-OK only for a backend failure.
  absl::Status RunDiskLoads(std::vector<Scheduled>* batch);
  // Reserves rows up to `total_tokens` for `seq`, preempting the newest running sequences
  // while the pool is short. False if `seq` itself was preempted.
  bool ReserveOrPreempt(Sequence* seq, int32_t total_tokens);
  void Preempt(Sequence* seq);
  void SortRunning();
  void FailRunning(const absl::Status& status);
  // Samples the token at the end of `seq` from `logits`, emits it, and finishes the
  // sequence on a stop condition.
  void SampleAndEmit(Sequence* seq, absl::Span<const float> logits, absl::Time now);
  void FinishSequence(Sequence* seq, FinishReason reason);
  // Prompt logprobs (engine/score_store.h): whether `seq` still scores its prompt; the
  // tokens an admission may take from the pool (only blocks that carry score records, and
  // the last row of the last one recomputed, since its logits score the next position);
  // scoring the rows of a computed chunk and recording the blocks it completed; the kPrompt
  // event, and for max_new_tokens = 0 the request's end.
  bool Scoring(const Sequence* seq) const;
  int32_t ScoredPrefixBlocks(const Sequence* seq) const;
  void TakeScores(const Sequence* seq, int32_t num_cached);
  void ScoreRows(const Scheduled& s, absl::Span<const float> rows);
  void EmitPrompt(Sequence* seq);
  void EndRequest(RequestState* request, const absl::Status& status);
  void ReleaseSequence(Sequence* seq);
  void Prune();  // drops finished sequences from the queues
  void UpdateCounts();

  const SchedulerOptions options_;
  Backend* const backend_;
  KvCache* const cache_;
  std::vector<std::unique_ptr<RequestState>> requests_;
  absl::Status fatal_error_;  // see fatal_error()
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // sorted by (admit_order, sample_index)
  std::vector<BlockCopy> pending_copies_;
  std::vector<DiskLoad> pending_loads_;
  std::vector<uint8_t> load_buffer_;  // one block's K/V bytes
  int64_t next_admit_order_ = 0;
  SchedulerCounters counters_;
  std::vector<double> ttft_, tpot_, disk_load_, remote_load_;
  AdapterTokenCounts adapter_tokens_;  // since the last DrainAdapterTokens
  std::vector<float> logits_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_SCHEDULER_H_
