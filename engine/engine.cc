// Engine: the thread around the Scheduler. Callers only touch `Shared` (under its mutex) and
// their RequestStreams; the KvCache, the Backend and the Scheduler belong to the engine
// thread.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/check.h"
#include "cache/block_key.h"
#include "cache/kv_cache.h"
#include "engine/block_residency.h"
#include "engine/dtype.h"
#include "engine/kv_event_recorder.h"
#include "engine/kv_offloader.h"
#include "engine/kv_tiers.h"
#include "engine/lora_adapter.h"
#include "engine/request_stream.h"
#include "engine/scheduler.h"
#include "engine/score_store.h"
#include "engine/tier_event_inbox.h"

namespace prefixd {

namespace {

absl::Status ValidateTenantPolicy(const TenantPolicy& p) {
  if (p.weight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant `", p.name, "`: weight must be at least 1, got ", p.weight));
  }
  if (p.cache_share && !(*p.cache_share > 0 && *p.cache_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant `", p.name, "`: share must be in (0, 1], got ", *p.cache_share));
  }
  if (p.max_waiting && *p.max_waiting < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant `", p.name, "`: max_waiting must be >= 0, got ", *p.max_waiting));
  }
  return absl::OkStatus();
}

absl::Status ValidateTenantOptions(const EngineOptions& o) {
  if (!(o.tenant_cache_share > 0 && o.tenant_cache_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tenant-cache-share must be a fraction of the pool in (0, 1], got ",
        o.tenant_cache_share));
  }
  if (o.tenant_max_waiting < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tenant-max-waiting must be >= 0 (0: no cap), got ", o.tenant_max_waiting));
  }
  if (o.max_cache_retention < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-cache-retention must not be negative, got ",
        absl::FormatDuration(o.max_cache_retention)));
  }
  for (const TenantPolicy& p : o.tenants) {
    if (absl::Status s = ValidateTenantPolicy(p); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

// What caller threads and the engine thread exchange. Held by shared_ptr so a RequestStream
// that outlives the engine can still Cancel() harmlessly.
struct Engine::Shared {
  absl::Mutex mu;
  std::vector<std::unique_ptr<RequestState>> incoming ABSL_GUARDED_BY(mu);
  std::vector<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
  bool wake ABSL_GUARDED_BY(mu) = false;
  bool draining ABSL_GUARDED_BY(mu) = false;
  absl::Time drain_deadline ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  bool stopped ABSL_GUARDED_BY(mu) = false;
  // Set once the backend reported a fatal device error: Submit refuses from then on.
  absl::Status fatal ABSL_GUARDED_BY(mu);
  // Requests the scheduler holds that are not running, for max_queue.
  std::atomic<int64_t> scheduler_waiting{0};
  // Requests submitted and not yet admitted, by tenant, for the waiting caps: the
  // scheduler's, republished after each step with those still incoming, plus each Submit
  // since. Only tenants with some.
  absl::flat_hash_map<std::string, int64_t> waiting_by_tenant ABSL_GUARDED_BY(mu);
  // The caps (TenantPolicy::max_waiting, 0: none): the policies' own, else the default.
  absl::flat_hash_map<std::string, int32_t> max_waiting ABSL_GUARDED_BY(mu);
  int32_t default_max_waiting ABSL_GUARDED_BY(mu) = 0;

  int32_t MaxWaiting(const std::string& tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = max_waiting.find(tenant);
    return it == max_waiting.end() ? default_max_waiting : it->second;
  }
  void SetMaxWaiting(const std::vector<TenantPolicy>& policies) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    max_waiting.clear();
    for (const TenantPolicy& p : policies) {
      if (p.max_waiting) max_waiting[p.name] = *p.max_waiting;
    }
  }
};

Engine::Engine(const EngineOptions& options, std::vector<EngineTier> tiers,
               std::unique_ptr<ScoreStore> scores, std::unique_ptr<KvOffloader> offloader,
               std::unique_ptr<KvEventRecorder> events, std::unique_ptr<BlockResidency> residency,
               std::unique_ptr<KvCache> cache,
               std::shared_ptr<Shared> shared)
    : options_(options),
      tiers_(std::move(tiers)),
      scores_(std::move(scores)),
      offloader_(std::move(offloader)),
      events_(std::move(events)),
      residency_(std::move(residency)),
      cache_(std::move(cache)),
      shared_(std::move(shared)),
      scheduler_(std::make_unique<Scheduler>(SchedulerOptions{
          .backend = options.backend,
          .cache = cache_.get(),
          .model_config = options.model_config,
          .max_batch_tokens = options.max_batch_tokens,
          .clock = options_.clock,
          .offloader = offloader_->has_tiers() ? offloader_.get() : nullptr,
          // Records live only while their blocks are indexed.
          .scores = options.enable_prefix_cache ? scores_.get() : nullptr,
          .tenant_cache_share = options.tenant_cache_share,
          .max_cache_retention = options.max_cache_retention,
          .tenants = options.tenants})) {
  limits_.model_config = options.model_config;
  limits_.max_samples = options.max_samples;
  limits_.pool = options.backend->kv_pool();
  limits_.computes_all_logits = options.backend->computes_all_logits();
  limits_.applies_lora = options.backend->applies_lora();
  PublishStats();
  // The disk tier's files found at start-up, right after the publisher's AllBlocksCleared.
  if (events_ != nullptr) events_->Flush();
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<std::shared_ptr<RequestStream>> Engine::Submit(EngineRequest request) {
  if (absl::Status valid = ValidateEngineRequest(request, limits_); !valid.ok()) return valid;
  auto state = std::make_unique<RequestState>();
  state->root = CacheRootKey(options_.manifest_sha256, request.cache_namespace,
                             request.adapter != nullptr ? request.adapter->digest : "");
  state->usage.prompt_tokens = static_cast<uint32_t>(request.prompt.size());
  state->request = std::move(request);
  std::shared_ptr<Shared> shared = shared_;
  auto stream = std::make_shared<RequestStream>([shared] {
    absl::MutexLock lock(&shared->mu);
    shared->wake = true;
  });
  state->stream = stream;
  absl::MutexLock lock(&shared_->mu);
  if (shared_->draining) {
    return absl::UnavailableError("server is shutting down: not accepting new requests");
  }
  if (!shared_->fatal.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "the backend failed and this server is restarting: ", shared_->fatal.message()));
  }
  const std::string& tenant = state->request.tenant;
  if (const int32_t cap = shared_->MaxWaiting(tenant); cap > 0) {
    auto it = shared_->waiting_by_tenant.find(tenant);
    const int64_t waiting = it == shared_->waiting_by_tenant.end() ? 0 : it->second;
    if (waiting >= cap) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "tenant `%s` has %d requests waiting, its cap (--tenant-max-waiting or max_waiting= "
          "in --auth-tokens): retry later",
          tenant, waiting));
    }
  }
  const int64_t queued =
      static_cast<int64_t>(shared_->incoming.size()) + shared_->scheduler_waiting.load();
  if (queued >= options_.max_queue) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "request queue is full (%d requests waiting): retry later", options_.max_queue));
  }
  state->submit_time = options_.clock();
  ++shared_->waiting_by_tenant[tenant];
  shared_->incoming.push_back(std::move(state));
  return stream;
}

void Engine::BeginShutdown(absl::Duration grace) {
  absl::MutexLock lock(&shared_->mu);
  const absl::Time deadline = absl::Now() + grace;
  if (!shared_->draining || deadline < shared_->drain_deadline) {
    shared_->drain_deadline = deadline;
  }
  shared_->draining = true;
}

void Engine::Shutdown(absl::Duration grace) {
  BeginShutdown(grace);
  absl::MutexLock lock(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::Stats() const {
  EngineStats s;
  {
    absl::MutexLock lock(&stats_mu_);
    s = stats_;
  }
  // The tiers' threads work between steps: read their counters now, so that an idle
  // engine's stats still show the spills written since its last step (the tiers are
  // thread-safe and live as long as the engine).
  for (const EngineTier& t : tiers_) t.read_stats(&s);
  return s;
}

Engine::Latencies Engine::DrainLatencies() {
  absl::MutexLock lock(&stats_mu_);
  Latencies out = std::move(latencies_);
  latencies_ = Latencies();
  return out;
}

AdapterTokenCounts Engine::DrainAdapterTokens() {
  absl::MutexLock lock(&stats_mu_);
  AdapterTokenCounts out = std::move(adapter_tokens_);
  adapter_tokens_.clear();
  return out;
}

void Engine::RunBetweenSteps(std::function<void()> task) {
  absl::Notification done;
  bool posted = false;
  {
    absl::MutexLock lock(&shared_->mu);
    if (!shared_->stopped) {
      // Loop() runs every task it is given, including those left when it stops.
      shared_->tasks.push_back([&] {
        task();
        done.Notify();
      });
      posted = true;
    }
  }
  if (!posted) {
    task();  // the engine thread is gone: this thread is the only user of its state
    return;
  }
  done.WaitForNotification();
}

void Engine::Loop() {
  bool stalled = false;     // the last step found nothing it could run
  bool drain_seen = false;  // this loop has seen the drain begin
  while (true) {
    std::vector<std::unique_ptr<RequestState>> incoming;
    std::vector<std::function<void()>> tasks;
    bool draining;
    absl::Time deadline;
    {
      absl::MutexLock lock(&shared_->mu);
      // Only Shared's fields and copies in the condition: absl may evaluate it on other
      // threads. A drain already seen is no news: a stalled loop (requests parked on their
      // loads) waits for the wake instead of spinning through the grace.
      Shared* s = shared_.get();
      auto ready = [s, drain_seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
        return !s->incoming.empty() || !s->tasks.empty() || s->wake ||
               (s->draining && !drain_seen);
      };
      if (scheduler_->idle()) {
        // Idle and draining: the loop ends below, without waiting.
        auto idle_ready = [s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
          return !s->incoming.empty() || !s->tasks.empty() || s->wake || s->draining;
        };
        shared_->mu.Await(absl::Condition(&idle_ready));
      } else if (stalled) {
        // Requests wait but none can run: only news (a request, a cancel, shutdown) can
        // change that, so wait for it instead of spinning. The timeout is a safety net.
        shared_->mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(10));
      }
      incoming.swap(shared_->incoming);
      tasks.swap(shared_->tasks);
      shared_->wake = false;
      draining = shared_->draining;
      deadline = shared_->drain_deadline;
      drain_seen = draining;
    }
    for (auto& r : incoming) {
      if (events_ != nullptr) {
        const EngineRequest& q = r->request;
        events_->NoteRoot(r->root, q.adapter_name,
                          q.adapter != nullptr ? q.adapter->digest : std::string(),
                          q.cache_namespace);
      }
      scheduler_->Enqueue(std::move(r));
    }
    for (auto& t : tasks) t();
    scheduler_->HandleCancellations();
    if (draining && (scheduler_->idle() || absl::Now() >= deadline)) {
      scheduler_->EndAll(absl::UnavailableError("server is shutting down"));
      PublishStats();
      scheduler_->FlushEvents();
      SpillAtShutdown(deadline);
      PublishStats();
      if (events_ != nullptr) events_->Flush();
      break;
    }
    stalled = !scheduler_->Step();
    const bool newly_fatal = !scheduler_->fatal_error().ok() && !fatal_reported_;
    if (!scheduler_->fatal_error().ok()) {
      // The device is unusable from now on: nothing queued or running can complete.
      if (newly_fatal) {
        absl::MutexLock lock(&shared_->mu);
        shared_->fatal = scheduler_->fatal_error();
      }
      scheduler_->EndAll(absl::InternalError(
          absl::StrCat("backend failure: ", scheduler_->fatal_error().message())));
    }
    PublishStats();
    scheduler_->FlushEvents();
    if (events_ != nullptr) events_->Flush();
    if (newly_fatal) {
      fatal_reported_ = true;
      if (options_.on_fatal_error) options_.on_fatal_error(scheduler_->fatal_error());
    }
  }
  std::vector<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->stopped = true;
    tasks.swap(shared_->tasks);
  }
  for (auto& t : tasks) t();
}

void Engine::SpillAtShutdown(absl::Time grace_deadline) {
  offloader_->SpillAtShutdown(cache_.get(),
                              std::min(grace_deadline, absl::Now() + kDiskTierShutdownSpill));
}

absl::Status Engine::SetTenantPolicies(std::vector<TenantPolicy> policies) {
  for (const TenantPolicy& p : policies) {
    if (absl::Status s = ValidateTenantPolicy(p); !s.ok()) return s;
  }
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->SetMaxWaiting(policies);
  }
  RunBetweenSteps([this, &policies] { scheduler_->SetTenantPolicies(policies); });
  return absl::OkStatus();
}

void Engine::PublishStats() {
  EngineStats now{.cache = cache_->Stats(),
                  .scheduler = scheduler_->counters(),
                  .tenants = scheduler_->TenantStats()};
  shared_->scheduler_waiting.store(static_cast<int64_t>(now.scheduler.waiting_requests));
  {
    // Every request swapped out of `incoming` is in the scheduler by now.
    absl::MutexLock lock(&shared_->mu);
    shared_->waiting_by_tenant.clear();
    scheduler_->WaitingByTenant(&shared_->waiting_by_tenant);
    for (const auto& r : shared_->incoming) ++shared_->waiting_by_tenant[r->request.tenant];
  }
  absl::MutexLock lock(&stats_mu_);
  stats_ = now;
  for (const EngineTier& t : tiers_) t.read_stats(&stats_);
  scheduler_->DrainLatencies(&latencies_.ttft, &latencies_.tpot, &latencies_.disk_load,
                             &latencies_.remote_load);
  if (residency_ != nullptr) {
    BlockResidency::Observations residency{
        .lifetime = std::move(latencies_.block_lifetime),
        .idle_before_eviction = std::move(latencies_.block_idle_before_eviction),
        .reuse_gap = std::move(latencies_.block_reuse_gap)};
    residency_->Drain(&residency);
    latencies_.block_lifetime = std::move(residency.lifetime);
    latencies_.block_idle_before_eviction = std::move(residency.idle_before_eviction);
    latencies_.block_reuse_gap = std::move(residency.reuse_gap);
  }
  scheduler_->DrainAdapterTokens(&adapter_tokens_);
  for (std::vector<double>* v :
       {&latencies_.ttft, &latencies_.tpot, &latencies_.disk_load, &latencies_.remote_load,
        &latencies_.block_lifetime, &latencies_.block_idle_before_eviction,
        &latencies_.block_reuse_gap}) {
    if (v->size() > kMaxPendingLatencies) {
      v->erase(v->begin(), v->end() - kMaxPendingLatencies / 2);  // keep the latest half
    }
  }
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.backend == nullptr)
    return absl::InvalidArgumentError("EngineOptions.backend is null");
  const ModelConfig& c = options.model_config;
  if (c.vocab_size <= 0 || c.n_positions <= 0) {
    return absl::InvalidArgumentError(
        "EngineOptions.model_config has no vocab_size or n_positions");
  }
  using Named = std::pair<const char*, int32_t>;
  for (const auto& [flag, value] : {Named{"--max-batch-tokens", options.max_batch_tokens},
                                    Named{"--max-queue", options.max_queue},
                                    Named{"--max-samples", options.max_samples}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " must be at least 1, got ", value));
    }
  }
  if (absl::Status s = ValidateTenantOptions(options); !s.ok()) return s;
  KvCacheOptions cache_options;
  cache_options.pool = options.backend->kv_pool();
  cache_options.enable_prefix_cache = options.enable_prefix_cache;
  // A load's part, or a disk file's event, may end after the engine: the wake holds Shared
  // too.
  auto shared = std::make_shared<Shared>();
  {
    absl::MutexLock lock(&shared->mu);
    shared->default_max_waiting = options.tenant_max_waiting;
    shared->SetMaxWaiting(options.tenants);
  }
  auto wake = [s = shared] {
    absl::MutexLock l(&s->mu);
    s->wake = true;
  };
  // The disk tier's files written, found and deleted on its own threads reach the KV events
  // through an inbox the engine thread drains (engine/tier_event_inbox.h); its pushes wake
  // the engine, so that a write finished while no request runs is still published.
  std::shared_ptr<TierEventInbox> disk_events;
  if (options.kv_events != nullptr && !options.disk_tier.dir.empty()) {
    disk_events = std::make_shared<TierEventInbox>(wake);
  }
  absl::StatusOr<std::vector<EngineTier>> tiers = OpenTiers(options, disk_events);
  if (!tiers.ok()) return tiers.status();
  std::vector<KvTier*> lookup;
  for (const EngineTier& t : *tiers) lookup.push_back(t.tier.get());
  auto scores = std::make_unique<ScoreStore>();
  auto offloader = std::make_unique<KvOffloader>(
      KvOffloader::Options{.backend = options.backend,
                           .tiers = std::move(lookup),
                           .scores = scores.get(),
                           .vocab_size = static_cast<uint32_t>(c.vocab_size),
                           .wake = wake});
  // A block's score record leaves with the block (engine/score_store.h), to the tiers that
  // take evicted blocks.
  std::unique_ptr<KvEventRecorder> events;
  if (options.kv_events != nullptr) {
    // vLLM names the pool's medium by its device: "GPU" for the CUDA backend's pool.
    events = std::make_unique<KvEventRecorder>(KvEventRecorder::Options{
        .sink = options.kv_events,
        .pool_medium = PoolMediumOfNumerics(options.backend->kv_numerics()),
        .block_size = options.backend->kv_pool().block_size,
        .disk_events = disk_events});
  }
  // Only indexed blocks have a residency: none without the prefix cache.
  std::unique_ptr<BlockResidency> residency;
  if (options.enable_prefix_cache) {
    residency = std::make_unique<BlockResidency>(
        cache_options.pool.num_blocks,
        options.clock ? options.clock : std::function<absl::Time()>([] { return absl::Now(); }));
    cache_options.on_reuse = [r = residency.get()](absl::Span<const int32_t> blocks) {
      r->OnReused(blocks);
    };
  }
  if (events != nullptr || residency != nullptr) {
    cache_options.on_index = [ev = events.get(), r = residency.get()](const IndexedBlock& b) {
      if (ev != nullptr) ev->OnIndexed(b);
      if (r != nullptr) r->OnIndexed(b.block);
    };
  }
  cache_options.on_evict = [o = offloader.get(), store = scores.get(), ev = events.get(),
                            r = residency.get()](const EvictedBlock& e) {
    o->OfferEvicted(e, store->Find(*e.key));
    store->Forget(*e.key);
    if (ev != nullptr) ev->OnEvicted(e);
    if (r != nullptr) r->OnEvicted(e.block);
  };
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(cache_options);
  if (!cache.ok()) return cache.status();
  EngineOptions resolved = options;
  if (!resolved.clock) resolved.clock = [] { return absl::Now(); };
  return std::unique_ptr<Engine>(new Engine(resolved, *std::move(tiers), std::move(scores),
                                            std::move(offloader), std::move(events),
                                            std::move(residency), *std::move(cache),
                                            std::move(shared)));
}

}  // namespace prefixd
