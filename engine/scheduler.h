// The scheduler: continuous batching over one KvCache and one Backend. Engine-thread only
// (engine.cc runs it); it has no locks and no threads, so tests can drive it step by step.
//
// Each Step() builds one batch:
//  1. every running sequence with one token left to compute (a decode) gets it, oldest
//     admission first; when the pool cannot hold a block for it even after eviction, the
//     most recently admitted sequence is preempted by recompute (blocks released, full ones
//     stay cached; requeued at the front);
//  2. what decodes leave of max_batch_tokens (the prefill budget) goes to prefill work:
//     chunks of sequences still prefilling and admissions of waiting requests, so a long
//     prompt delays running decodes by at most one chunk. Tenants take turns by weight
//     (engine/fair_share.h, start-time fair queuing over prompt tokens computed, the weight
//     TenantTable::Policy's): the tenant with the least service goes next with its next item,
//     and is charged the tokens scheduled. Within a tenant, work goes in arrival order: its
//     running prefills by admission, then its waiting requests in queue order. A lone tenant
//     is therefore served exactly in that order. The chunks are planned first (PlanChunks: a
//     waiting request's turn sets aside what admitting it would compute, its prompt less
//     the pool's cached prefix as its admission plan finds it (the tiers' blocks, known only
//     once admission asks them, count as computed; nothing while other sequences compute
//     its next blocks, as admission then skips it, nor while the pool has no room for it,
//     as admission then stops, and the running prefill it waits for must go on); a request
//     parked on a tier's match answer, a load or a fetch budget takes no turn, so its tenant
//     sets nothing aside and, with no other work, banks no credit while it waits) and
//     reserved in admission order as in 1, so a preemption never takes a sequence already in
//     the batch. What a turn set aside and its admission did not use (a tier's blocks, a
//     request out of room since, a pool that lost blocks since) goes to other admissions,
//     never to a chunk in the same step;
//  3. waiting requests are admitted, tenant by tenant as in 2, while budget and blocks
//     remain; one that fails for room stops admissions for the step (in order: wait for
//     room, of every tenant, so that a large request is not starved by small ones). One whose
//     prefix another running sequence is computing right now waits for those blocks
//     instead of computing them twice. With tiers behind the pool, the KvOffloader
//     (engine/kv_offloader.h) continues the prefix match after the pool's whole blocks
//     (disk, then remote; for a request with prompt logprobs only blocks that carry score
//     sections) and loads what it finds off this thread: the request is parked (skipped
//     by admission) until its load is done, while the others keep running; then it is
//     admitted with the blocks that arrived (a block that was gone or failed verification,
//     and every one after it, are computed).
// Then the copies cache/ asked for run, the offloader writes the loaded blocks into the
// admitted sequences' fresh blocks, the backend runs the batch and computed rows are marked
// (full blocks become shareable, and the offloader publishes them to the remote tier). The
// logits go to two components the scheduler only points at rows: a prompt chunk of a request
// with prompt logprobs to the PromptScorer (engine/prompt_scorer.h), the row of a sequence
// at the end of its tokens to the StepOutput stage (engine/step_output.h), which samples,
// appends and builds the events.
//
// Invariants: every request in the scheduler ends with exactly one kDone; a finished or
// preempted sequence holds no KvCache sequence; a backend error ends every request that was
// running (INTERNAL, the backend's message) and leaves the pool consistent; a parked
// sequence holds no KvCache sequence (only its TierLoad).
#ifndef PREFIXD_ENGINE_SCHEDULER_H_
#define PREFIXD_ENGINE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cache/kv_cache.h"
#include "engine/backend.h"
#include "engine/engine_stats.h"
#include "engine/fair_share.h"
#include "engine/kv_offloader.h"
#include "engine/model_config.h"
#include "engine/prompt_scorer.h"
#include "engine/score_store.h"
#include "engine/sequence.h"
#include "engine/step_output.h"
#include "engine/tenant_policy.h"
#include "engine/tenant_table.h"

namespace prefixd {

struct SchedulerOptions {
  Backend* backend = nullptr;  // not owned
  KvCache* cache = nullptr;    // not owned
  ModelConfig model_config;
  int32_t max_batch_tokens = 512;
  std::function<absl::Time()> clock;  // required
  // Not owned; null: no tiers behind the pool. Outlives the scheduler.
  KvOffloader* offloader = nullptr;
  // Not owned; null: no score records are kept (prompt logprobs are then always computed).
  ScoreStore* scores = nullptr;
  // Tenants (EngineOptions' fields of the same names).
  double tenant_cache_share = 1.0;
  absl::Duration max_cache_retention = absl::Hours(24);
  std::vector<TenantPolicy> tenants;
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
  // Replaces the tenants' policies (SchedulerOptions::tenants); known tenants take theirs.
  void SetTenantPolicies(const std::vector<TenantPolicy>& policies);
  // Adds, by tenant name, the requests not yet admitted (Engine::Submit's waiting cap).
  void WaitingByTenant(absl::flat_hash_map<std::string, int64_t>* out) const;
  // Each tenant seen: its name and its part of the pool (KvCache::TenantStats).
  std::vector<std::pair<std::string, TenantCacheStats>> TenantStats() const;

 private:
  struct Scheduled {
    Sequence* seq;
    int32_t start;  // num_computed before the step
    int32_t count;  // tokens forwarded
    bool decode;
    bool all_logits = false;  // a prompt chunk of a request with prompt_logprobs
  };

  // Blocks an admission took from a finished TierLoad: blocks first_block .. first_block +
  // count - 1 of seq's chain, written into its fresh blocks before the step's Forward.
  struct TierWrite {
    Sequence* seq;
    int32_t first_block;
    int32_t count;
    bool first_admission;
    bool scoring;  // the request scores its prompt: the blocks' records score positions
    std::shared_ptr<const TierLoad> load;
  };

  // Step 2's plan: the chunk of each running_ sequence still prefilling (by index; 0 for the
  // rest). Begins the FairShare step.
  std::vector<int32_t> PlanChunks(int32_t budget);
  // The pool admission a waiting `seq` asks for; `*scored_pool`: for a request that scores
  // its prompt, the leading blocks whose score records the store holds (else 0).
  AdmissionRequest AdmissionFor(const Sequence& seq, int32_t* scored_pool) const;
  // What admitting the waiting `seq` now would compute (PlanChunks' set-aside): its tokens
  // less the pool's cached prefix; 0 while running sequences compute its next blocks, and
  // 0 when it has no room (its admission would stop at kNoRoom).
  int32_t UncachedTokens(const Sequence& seq) const;
  // Whether committing `plan` leaves a block of headroom per running sequence, so that the
  // admission does not force a preemption at the very next decode. Shared prefix blocks may
  // stop being evictable, hence their count too (an upper bound).
  bool LeavesHeadroom(const AdmissionPlan& plan) const;
  void Admit(std::vector<Scheduled>* batch, int32_t* budget);
  enum AdmitOutcome {
    kAdmitted,  // running, its first chunk in the batch (`*count` tokens)
    kSkipped,   // stays waiting: its prefix is being computed, or its tier load is parked
    kNoRoom,    // stays waiting, and so does everyone after it this step
    kEnded,     // ended with an error
  };
  AdmitOutcome AdmitOne(Sequence* seq, absl::Time match_deadline, std::vector<Scheduled>* batch,
                        int32_t* budget, int32_t* count);
  const std::string& TenantOf(const Sequence* seq) const;
  // Writes the blocks of pending_writes_ into the pool (KvOffloader::Write), marks them
  // computed, hands their score records to the scorer and counts the hits. Non-OK only for
  // a backend failure.
  absl::Status RunTierWrites(const std::vector<Scheduled>& batch);
  // Reserves rows up to `total_tokens` for `seq`, preempting the newest running sequences
  // while the pool is short. False if `seq` itself was preempted.
  bool ReserveOrPreempt(Sequence* seq, int32_t total_tokens);
  void Preempt(Sequence* seq);
  void SortRunning();
  void FailRunning(const absl::Status& status);
  void Prune();  // drops finished sequences from the queues
  void UpdateCounts();
  // The retention clock (KvCache's retention unit): milliseconds since the Unix epoch.
  int64_t NowMillis() const;

  const SchedulerOptions options_;
  Backend* const backend_;
  KvCache* const cache_;
  std::vector<std::unique_ptr<RequestState>> requests_;
  absl::Status fatal_error_;  // see fatal_error()
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // sorted by (admit_order, sample_index)
  std::vector<BlockCopy> pending_copies_;
  std::vector<TierWrite> pending_writes_;
  int64_t next_admit_order_ = 0;
  SchedulerCounters counters_;
  std::vector<double> ttft_, tpot_, disk_load_, remote_load_;
  AdapterTokenCounts adapter_tokens_;  // since the last DrainAdapterTokens
  std::vector<float> logits_;
  PromptScorer scorer_;
  StepOutput output_;  // after scorer_ and the counters it points at
  TenantTable tenants_;
  // Weights in step with tenants_ (set at Enqueue and SetTenantPolicies).
  FairShare fair_;
  // Each request's order of arrival (FairShare's ties), until FlushEvents forgets it.
  absl::flat_hash_map<const RequestState*, uint64_t> arrival_;
  uint64_t next_arrival_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_SCHEDULER_H_
