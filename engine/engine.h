// The serving engine: one thread owns the KV pool (cache/) and the backend, and runs
// continuous batching. Callers Submit() requests and read their tokens from a thread-safe
// RequestStream (engine/request_stream.h); no caller thread ever touches the pool.
//
// Threads: callers touch only the state shared under one mutex (new requests, tasks, drain)
// and their streams; the KvCache, the Backend, the Scheduler and the KvOffloader (the tiers'
// engine side, engine/kv_offloader.h) belong to the engine thread. Streams' notify callbacks run on
// the engine thread and may only schedule work.
#ifndef PREFIXD_ENGINE_ENGINE_H_
#define PREFIXD_ENGINE_ENGINE_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine_options.h"
#include "engine/engine_stats.h"
#include "engine/request.h"
#include "engine/request_stream.h"
#include "engine/request_validation.h"

namespace prefixd {

class BlockResidency;
class KvCache;
class KvEventRecorder;
class KvOffloader;
class Scheduler;
class ScoreStore;
struct EngineTier;  // engine/kv_tiers.h

class Engine {
 public:
  // INVALID_ARGUMENT for options that cannot work (message says which); the disk tier's
  // FAILED_PRECONDITION when its directory cannot be used.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // Shutdown(zero grace).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues. INVALID_ARGUMENT for a request that could never run (message says
  // what to change), RESOURCE_EXHAUSTED when the queue is full or when the request's tenant
  // (EngineRequest::tenant) already has its cap of requests waiting (TenantPolicy::max_waiting,
  // else EngineOptions::tenant_max_waiting; 0: no cap; the message names the tenant), and
  // UNAVAILABLE once Shutdown began or after a fatal backend error. Waiting means submitted
  // and not yet admitted (a preempted request was admitted: it does not count again); a
  // tenant's count falls as the scheduler admits, so a refused caller may retry. Once
  // admitted, a request's share of admission and prefill is its tenant's weight (the
  // scheduler's rule, engine/scheduler.h).
  absl::StatusOr<std::shared_ptr<RequestStream>> Submit(EngineRequest request);

  // Refuses new requests; queued and running ones go on until `grace` ends, the rest end
  // with UNAVAILABLE. Does not wait: a later call may shorten the grace (never lengthen it).
  void BeginShutdown(absl::Duration grace);
  // BeginShutdown(grace), then returns when the engine thread has stopped.
  void Shutdown(absl::Duration grace);

  // The snapshot published after the last step, with the tiers' counters read now (their
  // threads work between steps: an idle engine still shows the spills written since).
  EngineStats Stats() const;

  // Replaces the tenants' policies (EngineOptions::tenants), between two steps: known tenants
  // take their new weight, share and waiting cap at once. INVALID_ARGUMENT for a policy out
  // of range (nothing changes then).
  absl::Status SetTenantPolicies(std::vector<TenantPolicy> policies);

  // Latency observations (seconds) since the last call, for histograms: time to first token
  // and time per output token.
  struct Latencies {
    std::vector<double> ttft;
    std::vector<double> tpot;
    std::vector<double> disk_load;    // per block read from the disk tier (read, verify, upload)
    std::vector<double> remote_load;  // per block read from the remote tier (GET, verify, upload)
    // Of the pool's indexed blocks (engine/block_residency.h): at eviction, the time since
    // indexing and since the last use; at each reuse, the time since the previous use.
    std::vector<double> block_lifetime;
    std::vector<double> block_idle_before_eviction;
    std::vector<double> block_reuse_gap;
  };
  // Observations waiting for DrainLatencies are bounded: with nobody draining (no metrics
  // scrape) a long-running server would otherwise grow by 8 bytes per token. Past this many
  // of a kind, the oldest are dropped down to half as many (a scraper that comes back late
  // sees the latest).
  static constexpr size_t kMaxPendingLatencies = size_t{1} << 20;
  Latencies DrainLatencies();

  // Prompt tokens of first admissions by adapter name since the last call (engine_stats.h):
  // for per-adapter counters. Pending entries are bounded by the distinct names admitted
  // between two calls; each name is one the server loaded.
  AdapterTokenCounts DrainAdapterTokens();

 private:
  friend class EngineTestPeer;  // tests/engine/engine_test_peer.h

  struct Shared;  // what caller threads and the engine thread exchange (engine.cc)

  Engine(const EngineOptions& options, std::vector<EngineTier> tiers,
         std::unique_ptr<ScoreStore> scores, std::unique_ptr<KvOffloader> offloader,
         std::unique_ptr<KvEventRecorder> events, std::unique_ptr<BlockResidency> residency,
         std::unique_ptr<KvCache> cache,
         std::shared_ptr<Shared> shared);

  // Runs `task` on the engine thread between two steps, or on the calling thread once the
  // engine thread has stopped; returns after it ran. The task may use the engine thread's
  // state (cache_, tiers_).
  void RunBetweenSteps(std::function<void()> task);
  void Loop();
  // Writes the blocks still cached in the pool to the disk tier, within what is left of the
  // grace and at most kDiskTierShutdownSpill.
  void SpillAtShutdown(absl::Time grace_deadline);
  void PublishStats();

  const EngineOptions options_;
  RequestLimits limits_;
  // The tiers behind the pool, in lookup order (engine/kv_tiers.h: the disk tier, then the
  // remote tier, each when configured). They outlive the offloader and every load.
  std::vector<EngineTier> tiers_;
  // Score records of cached blocks (engine/score_store.h); the pool's eviction hook forgets
  // them, so it outlives the cache too.
  std::unique_ptr<ScoreStore> scores_;
  // The tiers' side of the engine (engine/kv_offloader.h): the pool's eviction hook calls it,
  // so it outlives the cache; the scheduler's loads are dropped before it goes.
  std::unique_ptr<KvOffloader> offloader_;
  // The KV events of the pool's hooks (engine/kv_event_recorder.h), or null without
  // --kv-events: the hooks call it, so it outlives the cache too.
  std::unique_ptr<KvEventRecorder> events_;
  // The residency histograms' observations (engine/block_residency.h), fed by the pool's
  // hooks too, so it outlives the cache as well.
  std::unique_ptr<BlockResidency> residency_;
  std::unique_ptr<KvCache> cache_;
  // Held by shared_ptr so a RequestStream that outlives the engine can still Cancel().
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<Scheduler> scheduler_;  // engine thread only
  bool fatal_reported_ = false;           // engine thread only
  std::thread thread_;
  absl::Mutex join_mu_;
  mutable absl::Mutex stats_mu_;
  EngineStats stats_ ABSL_GUARDED_BY(stats_mu_);
  Latencies latencies_ ABSL_GUARDED_BY(stats_mu_);
  AdapterTokenCounts adapter_tokens_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_ENGINE_H_
