#include "server/metrics.h"

#include <algorithm>
#include <utility>

#include "prometheus/text_serializer.h"

namespace prefixd {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Latency buckets in seconds. TTFT spans a prefill (ms on a GPU, up to seconds for a long
// prompt on a CPU); TPOT is one decode step (sub-ms to ~100 ms).
const prometheus::Histogram::BucketBoundaries kTtftBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                              0.5,   1,    2.5,   5,    10,  30};
// One block from the disk tier: ~0.1 ms from the page cache to ~10 ms from a slow disk.
const prometheus::Histogram::BucketBoundaries kDiskLoadBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1};
// One block from the remote tier: a GET of ~1 MB over a LAN is ~1 ms; its timeout is 20 ms.
const prometheus::Histogram::BucketBoundaries kRemoteLoadBuckets = {
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25};
// A cached block's residency: a burst of requests reuses it within seconds, a chat's next
// turn within minutes, a shared system prompt for hours.
const prometheus::Histogram::BucketBoundaries kResidencyBuckets = {
    0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400};
const prometheus::Histogram::BucketBoundaries kTpotBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025,
                                                              0.05,  0.1,    0.25,  0.5,  1};

}  // namespace

ServerMetrics::ServerMetrics(MetricsSources sources)
    : sources_(std::move(sources)), registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  // = sum of prompt lengths of requests at their first admission, by adapter (summed over
  //   it: KvCacheStats::queried_tokens).
  queried_tokens_ = &BuildCounter()
                         .Name("prefixd_prefix_cache_queried_tokens_total")
                         .Help(
                             "Prompt tokens of admitted requests, looked up in the prefix "
                             "cache, by adapter (the base model's name for the base)")
                         .Register(r);
  // = sum of cached_prompt_tokens = min(matched prefix, prompt length - 1) at first admission,
  //   from any tier (pool + disk + remote), by adapter (summed over it: HitTokens()).
  hit_tokens_ = &BuildCounter()
                     .Name("prefixd_prefix_cache_hit_tokens_total")
                     .Help(
                         "Prompt tokens served from the prefix cache, RAM pool or disk or "
                         "remote tier (cached_prompt_tokens), by adapter")
                     .Register(r);
  // = the part of prefixd_prefix_cache_hit_tokens_total found in the RAM/GPU pool
  //   (KvCacheStats::hit_tokens): with the disk and remote parts below, the per-tier hits.
  AddStatsCounter("prefixd_pool_cache_hit_tokens_total",
                  "Prompt tokens served from the KV pool itself (part of the hit tokens)",
                  [](const EngineStats& s) { return s.cache.hit_tokens; });
  // = the part of prefixd_prefix_cache_hit_tokens_total read back from the disk tier.
  AddStatsCounter("prefixd_disk_cache_hit_tokens_total",
                  "Prompt tokens served from the disk cache tier (part of the hit tokens)",
                  [](const EngineStats& s) { return s.scheduler.disk_hit_tokens; });
  // = blocks written to the disk tier (evicted from the pool, or at shutdown).
  AddStatsCounter("prefixd_disk_cache_spills_total", "KV blocks written to the disk cache tier",
                  [](const EngineStats& s) { return s.disk.spills; });
  // = evicted blocks not written: write queue full, write error, too large, shutdown.
  AddStatsCounter("prefixd_disk_cache_spills_dropped_total",
                  "Evicted KV blocks not written to the disk tier (queue full, write error)",
                  [](const EngineStats& s) { return s.disk.spills_dropped; });
  // = failed writes among the dropped spills (disk full, I/O error).
  AddStatsCounter("prefixd_disk_cache_write_errors_total",
                  "Disk tier writes that failed (disk full, I/O error)",
                  [](const EngineStats& s) { return s.disk.write_errors; });
  // = blocks read from the disk tier, verified and copied into the pool.
  AddStatsCounter("prefixd_disk_cache_loads_total",
                  "KV blocks loaded from the disk cache tier into the pool",
                  [](const EngineStats& s) { return s.disk.loads; });
  // = block files that failed verification (checksum, key, tokens, layout): deleted, and
  //   their tokens computed instead.
  AddStatsCounter("prefixd_disk_cache_corrupt_blocks_total",
                  "Disk tier block files that failed verification (dropped, recomputed)",
                  [](const EngineStats& s) { return s.disk.corrupt_blocks; });
  // = block files deleted to stay under --cache-dir-bytes.
  AddStatsCounter("prefixd_disk_cache_evicted_files_total",
                  "Disk tier block files deleted to stay under the cap",
                  [](const EngineStats& s) { return s.disk.evicted_files; });
  // = the part of prefixd_prefix_cache_hit_tokens_total read from the remote (Redis) tier.
  AddStatsCounter("prefixd_remote_cache_hit_tokens_total",
                  "Prompt tokens served from the remote cache tier (part of the hit tokens)",
                  [](const EngineStats& s) { return s.scheduler.remote_hit_tokens; });
  // = blocks this server published to the remote tier (SET answered OK).
  AddStatsCounter("prefixd_remote_cache_stores_total",
                  "KV blocks published to the remote cache tier",
                  [](const EngineStats& s) { return s.remote.stores; });
  // = computed blocks not published: queue full, tier down or backing off, a failed SET.
  AddStatsCounter("prefixd_remote_cache_stores_dropped_total",
                  "Computed KV blocks not published to the remote tier (queue full, tier down)",
                  [](const EngineStats& s) { return s.remote.stores_dropped; });
  // = blocks read from the remote tier, verified and copied into the pool.
  AddStatsCounter("prefixd_remote_cache_loads_total",
                  "KV blocks loaded from the remote cache tier into the pool",
                  [](const EngineStats& s) { return s.remote.loads; });
  // = values that failed verification (checksum, key, tokens, layout): deleted, recomputed.
  AddStatsCounter("prefixd_remote_cache_corrupt_blocks_total",
                  "Remote tier values that failed verification (deleted, recomputed)",
                  [](const EngineStats& s) { return s.remote.corrupt_blocks; });
  // = matches not answered by their deadline (twice --kv-remote-timeout from the request
  //   asking, its wait behind an earlier round trip included): misses, their blocks computed.
  AddStatsCounter("prefixd_remote_cache_match_timeouts_total",
                  "Remote tier matches not answered by their deadline (misses, computed)",
                  [](const EngineStats& s) { return s.remote.match_timeouts; });
  {
    // = faults by operation (connect incl. AUTH/SELECT, match, load, store); each one also
    //   starts the tier's backoff.
    auto& errors = BuildCounter()
                       .Name("prefixd_remote_cache_errors_total")
                       .Help("Remote cache tier faults by operation (connect, match, load, store)")
                       .Register(r);
    const std::pair<const char*, uint64_t (*)(const EngineStats&)> ops[] = {
        {"connect", [](const EngineStats& s) { return s.remote.connect_errors; }},
        {"match", [](const EngineStats& s) { return s.remote.match_errors; }},
        {"load", [](const EngineStats& s) { return s.remote.load_errors; }},
        {"store", [](const EngineStats& s) { return s.remote.store_errors; }},
    };
    absl::MutexLock lock(&mu_);
    for (const auto& [op, read] : ops) {
      stats_counters_.push_back({&errors.Add({{"op", op}}), read, 0});
    }
  }
  remote_up_ = &BuildGauge()
                    .Name("prefixd_remote_cache_up")
                    .Help("1 while the remote cache tier's last command succeeded, else 0")
                    .Register(r)
                    .Add({});
  // free + active + cached = the pool's blocks.
  auto& blocks = BuildGauge()
                     .Name("prefixd_kv_blocks")
                     .Help(
                         "KV blocks by state: free (unused), active (referenced by a "
                         "sequence), cached (unreferenced, indexed, evictable)")
                     .Register(r);
  blocks_free_ = &blocks.Add({{"state", "free"}});
  blocks_active_ = &blocks.Add({{"state", "active"}});
  blocks_cached_ = &blocks.Add({{"state", "cached"}});
  // = blocks_active / blocks_total: what a load balancer's endpoint picker reads as KV
  //   cache utilisation (cached blocks are reclaimable, so they do not count as used).
  usage_ratio_ = &BuildGauge()
                      .Name("prefixd_kv_cache_usage_ratio")
                      .Help("KV blocks held by running sequences / all blocks (0 to 1)")
                      .Register(r)
                      .Add({});
  pool_bytes_ = &BuildGauge()
                     .Name("prefixd_kv_pool_bytes")
                     .Help("Bytes of the KV pool (blocks x block_size x bytes per token)")
                     .Register(r)
                     .Add({});
  bytes_per_token_ = &BuildGauge()
                          .Name("prefixd_kv_bytes_per_token")
                          .Help(
                              "KV bytes per token = 2 x layers x heads x head_dim x "
                              "bytes per element")
                          .Register(r)
                          .Add({});
  // = number of cached blocks taken back (their index entry dropped) to satisfy allocations.
  AddStatsCounter("prefixd_kv_evictions_total",
                  "Cached KV blocks evicted (least recently used first)",
                  [](const EngineStats& s) { return s.cache.evictions; });
  // = number of block copies made: partial-block prefix matches + first writes into a block
  //   shared by forked samples.
  AddStatsCounter("prefixd_kv_cow_copies_total",
                  "KV blocks copied on write (partial prefix matches, sample forks)",
                  [](const EngineStats& s) { return s.cache.cow_copies; });
  // = sum over those copies of the rows (token positions) each moved.
  AddStatsCounter("prefixd_kv_cow_rows_total",
                  "KV rows (token positions) moved by copy-on-write block copies",
                  [](const EngineStats& s) { return s.cache.cow_rows; });
  // = sum over admissions (re-admissions after preemption included) of the sequence's tokens
  //   (the prompt, plus on a re-admission the tokens it had generated) - tokens taken from
  //   the cache: tokens the backend computed in prefill.
  AddStatsCounter("prefixd_prefill_tokens_total",
                  "Prompt tokens computed in prefill (not served from the cache)",
                  [](const EngineStats& s) { return s.scheduler.prefill_tokens; });
  // = sum of tokens sampled over all samples, stop/EOS tokens excluded.
  AddStatsCounter("prefixd_generated_tokens_total",
                  "Tokens generated (completion tokens of all samples)",
                  [](const EngineStats& s) { return s.scheduler.generated_tokens; });
  // = sum over requests with prompt logprobs of (prompt length - 1): positions scored.
  AddStatsCounter("prefixd_prompt_logprob_tokens_total",
                  "Prompt positions whose log-probability was returned (prompt logprobs, echo)",
                  [](const EngineStats& s) { return s.scheduler.prompt_logprob_tokens; });
  // = of those, the positions taken from score records kept with cached blocks (not
  //   recomputed).
  AddStatsCounter("prefixd_prompt_logprob_tokens_cached_total",
                  "Prompt logprob positions served from the prefix cache's score records",
                  [](const EngineStats& s) { return s.scheduler.prompt_logprob_tokens_cached; });
  // = number of times a running sequence was preempted by recompute for lack of blocks.
  AddStatsCounter("prefixd_preemptions_total",
                  "Sequences preempted (blocks released, recomputed later)",
                  [](const EngineStats& s) { return s.scheduler.preemptions; });
  // = number of generate requests finished (gRPC Generate calls; HTTP completions, one per
  //   prompt), by front end, status code (gRPC's name for it in both) and adapter.
  requests_ = &BuildCounter()
                   .Name("prefixd_requests_total")
                   .Help(
                       "Generate requests finished, by front end (api), status code and "
                       "adapter (the base model's name for the base, \"\" if none resolved)")
                   .Register(r);
  running_ = &BuildGauge()
                  .Name("prefixd_running_requests")
                  .Help("Requests admitted and running in the engine")
                  .Register(r)
                  .Add({});
  waiting_ = &BuildGauge()
                  .Name("prefixd_waiting_requests")
                  .Help("Requests queued, waiting for admission")
                  .Register(r)
                  .Add({});
  ttft_ = &BuildHistogram()
               .Name("prefixd_time_to_first_token_seconds")
               .Help("Seconds from submission to a request's first token")
               .Register(r)
               .Add({}, kTtftBuckets);
  tpot_ = &BuildHistogram()
               .Name("prefixd_time_per_output_token_seconds")
               .Help("Seconds between consecutive tokens of a sample")
               .Register(r)
               .Add({}, kTpotBuckets);
  auto& disk = BuildGauge()
                   .Name("prefixd_disk_cache_bytes")
                   .Help("Disk cache tier: bytes of block files (all models), and the cap")
                   .Register(r);
  disk_bytes_ = &disk.Add({{"kind", "used"}});
  disk_cap_bytes_ = &disk.Add({{"kind", "cap"}});
  disk_blocks_ = &BuildGauge()
                      .Name("prefixd_disk_cache_blocks")
                      .Help("Block files of this model in the disk cache tier")
                      .Register(r)
                      .Add({});
  disk_queued_ = &BuildGauge()
                      .Name("prefixd_disk_cache_queued_blocks")
                      .Help("Evicted KV blocks waiting for the disk tier's writer or being written")
                      .Register(r)
                      .Add({});
  disk_load_ = &BuildHistogram()
                    .Name("prefixd_disk_cache_load_seconds")
                    .Help("Seconds to read, verify and copy one block from the disk tier")
                    .Register(r)
                    .Add({}, kDiskLoadBuckets);
  remote_load_ = &BuildHistogram()
                      .Name("prefixd_remote_cache_load_seconds")
                      .Help("Seconds to fetch, verify and copy one block from the remote tier")
                      .Register(r)
                      .Add({}, kRemoteLoadBuckets);
  // vLLM's cache-residency histograms (engine/block_residency.h), over every indexed block
  // of the pool: observed at eviction (lifetime, idle) and at each reuse (gap).
  block_lifetime_ = &BuildHistogram()
                         .Name("prefixd_kv_block_lifetime_seconds")
                         .Help(
                             "Seconds a pool block stayed in the prefix index, observed at "
                             "its eviction")
                         .Register(r)
                         .Add({}, kResidencyBuckets);
  block_idle_ = &BuildHistogram()
                     .Name("prefixd_kv_block_idle_before_evict_seconds")
                     .Help(
                         "Seconds from a pool block's last use (indexing or a prefix hit) "
                         "to its eviction")
                     .Register(r)
                     .Add({}, kResidencyBuckets);
  block_reuse_gap_ = &BuildHistogram()
                          .Name("prefixd_kv_block_reuse_gap_seconds")
                          .Help(
                              "Seconds between consecutive uses of a pool block (its "
                              "indexing, then each prefix hit that reads it)")
                          .Register(r)
                          .Add({}, kResidencyBuckets);
  // Per tenant (EngineStats::tenants, KvCache::TenantStats), labelled by name for the
  // MetricsSources::tenant_labels and "other" for the rest:
  // = its indexed, unowned pool blocks now (the blocks its cache share counts);
  tenant_cached_ = &BuildGauge()
                        .Name("prefixd_tenant_cached_blocks")
                        .Help("Cached (unreferenced) KV pool blocks by tenant")
                        .Register(r);
  // = Σ num_cached from the pool at its first admissions;
  tenant_hits_ = &BuildCounter()
                      .Name("prefixd_tenant_pool_hit_tokens_total")
                      .Help("Prompt tokens served from the KV pool, by tenant")
                      .Register(r);
  // = its cached blocks evicted from the pool.
  tenant_evictions_ = &BuildCounter()
                           .Name("prefixd_tenant_evictions_total")
                           .Help("Cached KV pool blocks evicted, by tenant")
                           .Register(r);
  // = KvEventPublisher::published(): batches sent on the --kv-events PUB socket.
  kv_events_published_ = &BuildCounter()
                              .Name("prefixd_kv_events_published_total")
                              .Help("KV event batches published on --kv-events")
                              .Register(r)
                              .Add({});
  // = KvEventPublisher::dropped(): batches dropped with the publish queue full (each left a
  // gap in the sequence numbers, followed by a full resync).
  kv_events_dropped_ = &BuildCounter()
                            .Name("prefixd_kv_events_dropped_total")
                            .Help("KV event batches dropped because the publish queue was full")
                            .Register(r)
                            .Add({});
  auto& memory = BuildGauge()
                     .Name("prefixd_memory_bytes")
                     .Help(
                         "Bytes the backend holds: weights, kv_pool, workspace; and the "
                         "loaded LoRA adapters' tensors and device copies: adapters")
                     .Register(r);
  mem_weights_ = &memory.Add({{"kind", "weights"}});
  mem_kv_pool_ = &memory.Add({{"kind", "kv_pool"}});
  mem_workspace_ = &memory.Add({{"kind", "workspace"}});
  mem_adapters_ = &memory.Add({{"kind", "adapters"}});
  // Make the base's series visible at 0 from the first scrape, so rate() works from the
  // start (a loaded adapter's from the first scrape after its load).
  absl::MutexLock lock(&mu_);
  AdapterSeries& base = SeriesLocked(sources_.base_name);
  TokenSeriesLocked(base, sources_.base_name);
  RequestsLocked(base, sources_.base_name, Api::kGrpc, absl::StatusCode::kOk);
  RequestsLocked(base, sources_.base_name, Api::kHttp, absl::StatusCode::kOk);
}

ServerMetrics::AdapterSeries& ServerMetrics::SeriesLocked(std::string_view adapter) const {
  auto it = adapter_series_.find(adapter);
  if (it == adapter_series_.end())
    it = adapter_series_.emplace(std::string(adapter), AdapterSeries()).first;
  return it->second;
}

prometheus::Counter& ServerMetrics::RequestsLocked(AdapterSeries& series, std::string_view adapter,
                                                   Api api, absl::StatusCode code) const {
  prometheus::Counter*& c = series.requests[{api, code}];
  if (c == nullptr) {
    c = &requests_->Add({{"api", ApiName(api)},
                         {"code", absl::StatusCodeToString(code)},
                         {"adapter", std::string(adapter)}});
  }
  return *c;
}

void ServerMetrics::TokenSeriesLocked(AdapterSeries& series, std::string_view adapter) const {
  if (series.queried != nullptr) return;
  series.queried = &queried_tokens_->Add({{"adapter", std::string(adapter)}});
  series.hit = &hit_tokens_->Add({{"adapter", std::string(adapter)}});
}

void ServerMetrics::RefreshAdaptersLocked() const {
  if (sources_.adapter_tokens) {
    for (const auto& [name, counts] : sources_.adapter_tokens()) {
      const std::string_view label = name.empty() ? std::string_view(sources_.base_name) : name;
      AdapterSeries& series = SeriesLocked(label);
      TokenSeriesLocked(series, label);
      series.queried->Increment(static_cast<double>(counts.queried_tokens));
      series.hit->Increment(static_cast<double>(counts.hit_tokens));
      series.counted = true;
    }
  }
  std::vector<std::string> loaded;
  if (sources_.adapter_names) loaded = sources_.adapter_names();
  for (const std::string& name : loaded) {
    AdapterSeries& series = SeriesLocked(name);
    TokenSeriesLocked(series, name);
    RequestsLocked(series, name, Api::kGrpc, absl::StatusCode::kOk);
    RequestsLocked(series, name, Api::kHttp, absl::StatusCode::kOk);
  }
  for (auto it = adapter_series_.begin(); it != adapter_series_.end();) {
    AdapterSeries& series = it->second;
    const bool stays = it->first == sources_.base_name || it->first == kUnresolvedAdapter ||
                       std::find(loaded.begin(), loaded.end(), it->first) != loaded.end();
    if (stays || series.counted) {
      // A name just unloaded keeps its series while there is something new to export.
      series.counted = false;
      ++it;
      continue;
    }
    if (series.queried != nullptr) {
      queried_tokens_->Remove(series.queried);
      hit_tokens_->Remove(series.hit);
    }
    for (const auto& [key, counter] : series.requests) requests_->Remove(counter);
    it = adapter_series_.erase(it);
  }
}

prometheus::Counter* ServerMetrics::AddStatsCounter(const std::string& name,
                                                    const std::string& help,
                                                    uint64_t (*read)(const EngineStats&)) {
  prometheus::Counter* c = &BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
  absl::MutexLock lock(&mu_);
  stats_counters_.push_back({c, read, 0});
  return c;
}

void ServerMetrics::RecordRequest(Api api, absl::StatusCode code, std::string_view adapter) {
  absl::MutexLock lock(&mu_);
  AdapterSeries& series = SeriesLocked(adapter);
  RequestsLocked(series, adapter, api, code).Increment();
  series.counted = true;
}

void ServerMetrics::RefreshLocked() const {
  if (sources_.stats) {
    const EngineStats now = sources_.stats();
    for (StatsCounter& c : stats_counters_) {
      const uint64_t value = c.read(now);
      if (value > c.last) {
        c.counter->Increment(static_cast<double>(value - c.last));
        c.last = value;
      }
    }
    blocks_free_->Set(static_cast<double>(now.cache.blocks_free));
    blocks_active_->Set(static_cast<double>(now.cache.blocks_active));
    blocks_cached_->Set(static_cast<double>(now.cache.blocks_cached));
    usage_ratio_->Set(now.cache.blocks_total > 0 ? static_cast<double>(now.cache.blocks_active) /
                                                       static_cast<double>(now.cache.blocks_total)
                                                 : 0.0);
    pool_bytes_->Set(static_cast<double>(now.cache.pool_bytes));
    bytes_per_token_->Set(static_cast<double>(now.cache.bytes_per_token));
    running_->Set(static_cast<double>(now.scheduler.running_requests));
    waiting_->Set(static_cast<double>(now.scheduler.waiting_requests));
    disk_bytes_->Set(static_cast<double>(now.disk.bytes));
    disk_cap_bytes_->Set(static_cast<double>(now.disk.cap_bytes));
    disk_blocks_->Set(static_cast<double>(now.disk.blocks));
    disk_queued_->Set(static_cast<double>(now.disk.queued_blocks));
    remote_up_->Set(now.remote.up ? 1.0 : 0.0);
    RefreshTenantsLocked(now);
  }
  if (sources_.kv_events) {
    const auto [published, dropped] = sources_.kv_events();
    if (published > kv_events_published_last_) {
      kv_events_published_->Increment(static_cast<double>(published - kv_events_published_last_));
      kv_events_published_last_ = published;
    }
    if (dropped > kv_events_dropped_last_) {
      kv_events_dropped_->Increment(static_cast<double>(dropped - kv_events_dropped_last_));
      kv_events_dropped_last_ = dropped;
    }
  }
  RefreshAdaptersLocked();
  if (sources_.latencies) {
    const Engine::Latencies lat = sources_.latencies();
    for (double s : lat.ttft) ttft_->Observe(s);
    for (double s : lat.tpot) tpot_->Observe(s);
    for (double s : lat.disk_load) disk_load_->Observe(s);
    for (double s : lat.remote_load) remote_load_->Observe(s);
    for (double s : lat.block_lifetime) block_lifetime_->Observe(s);
    for (double s : lat.block_idle_before_eviction) block_idle_->Observe(s);
    for (double s : lat.block_reuse_gap) block_reuse_gap_->Observe(s);
  }
  int64_t adapters = 0;
  if (sources_.memory) {
    const MemoryUsage m = sources_.memory();
    mem_weights_->Set(static_cast<double>(m.weights_bytes));
    mem_kv_pool_->Set(static_cast<double>(m.kv_pool_bytes));
    mem_workspace_->Set(static_cast<double>(m.workspace_bytes));
    adapters += m.adapter_bytes;  // the backend's own copies (CUDA: on the device)
  }
  // Plus the sum over loaded adapters of (in + out) x rank x 4 bytes per targeted module.
  if (sources_.adapter_bytes) adapters += sources_.adapter_bytes();
  if (sources_.memory || sources_.adapter_bytes) mem_adapters_->Set(static_cast<double>(adapters));
}

void ServerMetrics::SetTenantLabels(std::vector<std::string> labels) {
  absl::MutexLock lock(&mu_);
  sources_.tenant_labels = std::move(labels);
}

void ServerMetrics::RefreshTenantsLocked(const EngineStats& now) const {
  auto label_of = [&](const std::string& name) -> std::string {
    const std::vector<std::string>& named = sources_.tenant_labels;
    return std::find(named.begin(), named.end(), name) != named.end() ? name : "other";
  };
  // The named tenants' series exist from the start, at 0.
  std::map<std::string, double> cached;
  for (const std::string& name : sources_.tenant_labels) {
    cached[name] = 0;
    tenant_hits_->Add({{"tenant", name}});
    tenant_evictions_->Add({{"tenant", name}});
  }
  for (const auto& [name, st] : now.tenants) {
    const std::string label = label_of(name);
    cached[label] += static_cast<double>(st.cached_blocks);
    auto& [hits, evictions] = tenant_last_[name];
    if (st.hit_tokens > hits) {
      tenant_hits_->Add({{"tenant", label}}).Increment(static_cast<double>(st.hit_tokens - hits));
      hits = st.hit_tokens;
    }
    if (st.evictions > evictions) {
      tenant_evictions_->Add({{"tenant", label}})
          .Increment(static_cast<double>(st.evictions - evictions));
      evictions = st.evictions;
    }
  }
  std::map<std::string, prometheus::Gauge*> series;
  for (const auto& [label, blocks] : cached) {
    prometheus::Gauge* g = &tenant_cached_->Add({{"tenant", label}});
    g->Set(blocks);
    series[label] = g;
  }
  for (const auto& [label, g] : tenant_cached_series_) {
    if (!series.contains(label)) tenant_cached_->Remove(g);
  }
  tenant_cached_series_ = std::move(series);
}

std::vector<prometheus::MetricFamily> ServerMetrics::Collect() const {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  return registry_->Collect();
}

std::string ServerMetrics::ExpositionText() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

}  // namespace prefixd
