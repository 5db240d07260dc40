// Prometheus metrics of prefixd, collected on scrape: each scrape first pulls the engine's
// Stats() (counters advance by the delta since the previous scrape) and DrainLatencies()
// (observations go into the histograms), then serializes. No collector thread, and nothing
// is read from the engine between scrapes.
//
// Counters only ever increase: a delta is applied only when the engine's cumulative value
// grew. Every metric and its formula are listed in docs/SERVER.md.
//
// The `adapter` label (prefixd_requests_total, prefixd_prefix_cache_{queried,hit}_tokens_total)
// is the name a request was served under: the base model's name (MetricsSources::base_name;
// no adapter may take it) for the base, a LoRA adapter's name for an adapter, and "" on
// prefixd_requests_total for a refusal that named no loaded adapter (a client's unknown names
// never become series). Summed over `adapter` each family is what it was without the label.
// Series are bounded: those of the base, of "" and of the adapters loaded now stay; those of
// a name no longer loaded are exported by the scrapes up to the first one with nothing new to
// count for it, and removed by that one (its last values have been scraped by then). So
// after a load/unload storm at most --max-adapters + 2 label values remain, and a name loaded
// again starts new series from 0 (a counter reset to Prometheus).
#ifndef PREFIXD_SERVER_METRICS_H_
#define PREFIXD_SERVER_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/api.h"

namespace prefixd {

struct MetricsSources {
  std::function<EngineStats()> stats;
  std::function<Engine::Latencies()> latencies;
  std::function<MemoryUsage()> memory;
  // Host bytes of the loaded LoRA adapters (server/adapter_registry.h); unset: none.
  std::function<int64_t()> adapter_bytes;
  // Prompt tokens of first admissions by adapter name since the last call
  // (Engine::DrainAdapterTokens; "" = the base): the queried and hit token counters.
  std::function<AdapterTokenCounts()> adapter_tokens;
  // The names of the adapters loaded now (AdapterRegistry::List); unset: none.
  std::function<std::vector<std::string>()> adapter_names;
  // The `adapter` label of the base model's requests: the served model's name.
  std::string base_name;
  // The tenants whose per-tenant series carry their name (EngineStats::tenants); every
  // other tenant is counted under "other", which bounds the label's values.
  std::vector<std::string> tenant_labels;
  // KV event batches published and dropped so far (server/kv_events.h); unset: no
  // --kv-events (the counters stay at 0).
  std::function<std::pair<uint64_t, uint64_t>()> kv_events;
};

class ServerMetrics : public prometheus::Collectable {
 public:
  explicit ServerMetrics(MetricsSources sources);

  // One finished generate request (a gRPC Generate call, an HTTP completion's prompt), by
  // front end, status code (named as gRPC names it, whichever the front end) and the
  // `adapter` label value (see above; RequestPath::AdapterLabel).
  void RecordRequest(Api api, absl::StatusCode code, std::string_view adapter);

  // The tenants named in the per-tenant series from now on (MetricsSources::tenant_labels).
  void SetTenantLabels(std::vector<std::string> labels);

  // Refreshes from the sources, then returns every family (ExpositionText, per scrape).
  std::vector<prometheus::MetricFamily> Collect() const override;

  // The text exposition format, as /metrics serves it.
  std::string ExpositionText() const;

 private:
  void RefreshLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A counter that follows a cumulative field of EngineStats: each refresh adds what the
  // field grew by since the last one (never a decrease, so the counter never goes back).
  struct StatsCounter {
    prometheus::Counter* counter;
    uint64_t (*read)(const EngineStats&);
    uint64_t last = 0;
  };
  prometheus::Counter* AddStatsCounter(const std::string& name, const std::string& help,
                                       uint64_t (*read)(const EngineStats&));

  // The series of one `adapter` label value. Invariant: every pointer is a metric of its
  // family; removed together when the value is retired (RefreshAdaptersLocked).
  struct AdapterSeries {
    prometheus::Counter* queried = nullptr;  // created on first use
    prometheus::Counter* hit = nullptr;
    std::map<std::pair<Api, absl::StatusCode>, prometheus::Counter*> requests;
    bool counted = false;  // something was counted since the last refresh
  };
  AdapterSeries& SeriesLocked(std::string_view adapter) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  prometheus::Counter& RequestsLocked(AdapterSeries& series, std::string_view adapter, Api api,
                                      absl::StatusCode code) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TokenSeriesLocked(AdapterSeries& series, std::string_view adapter) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies drained token counts, makes the loaded names' series visible at 0 and retires
  // the values no longer loaded that had nothing new to count.
  void RefreshAdaptersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Per-tenant series from EngineStats::tenants: each tenant's label (its name, or "other").
  void RefreshTenantsLocked(const EngineStats& now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MetricsSources sources_;
  std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex mu_;
  mutable std::vector<StatsCounter> stats_counters_ ABSL_GUARDED_BY(mu_);

  prometheus::Gauge* blocks_free_;
  prometheus::Gauge* blocks_active_;
  prometheus::Gauge* blocks_cached_;
  prometheus::Gauge* usage_ratio_;
  prometheus::Gauge* pool_bytes_;
  prometheus::Gauge* bytes_per_token_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* queried_tokens_;
  prometheus::Family<prometheus::Counter>* hit_tokens_;
  mutable std::map<std::string, AdapterSeries, std::less<>> adapter_series_ ABSL_GUARDED_BY(mu_);
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* tpot_;
  prometheus::Gauge* disk_bytes_;
  prometheus::Gauge* disk_cap_bytes_;
  prometheus::Gauge* disk_blocks_;
  prometheus::Gauge* disk_queued_;
  prometheus::Histogram* disk_load_;
  prometheus::Gauge* remote_up_;
  prometheus::Counter* kv_events_published_;
  prometheus::Counter* kv_events_dropped_;
  mutable uint64_t kv_events_published_last_ ABSL_GUARDED_BY(mu_) = 0;
  mutable uint64_t kv_events_dropped_last_ ABSL_GUARDED_BY(mu_) = 0;
  prometheus::Histogram* remote_load_;
  prometheus::Family<prometheus::Gauge>* tenant_cached_;
  prometheus::Family<prometheus::Counter>* tenant_hits_;
  prometheus::Family<prometheus::Counter>* tenant_evictions_;
  // The tenant_cached_ series set by the last refresh, by label: one whose label no longer
  // holds a tenant (a reload renamed it, or nobody is "other" now) is removed, not left at
  // its last value.
  mutable std::map<std::string, prometheus::Gauge*> tenant_cached_series_ ABSL_GUARDED_BY(mu_);
  // The cumulative (hit tokens, evictions) of each tenant at the last refresh.
  mutable std::map<std::string, std::pair<uint64_t, uint64_t>> tenant_last_ ABSL_GUARDED_BY(mu_);
  prometheus::Histogram* block_lifetime_;
  prometheus::Histogram* block_idle_;
  prometheus::Histogram* block_reuse_gap_;
  prometheus::Gauge* mem_weights_;
  prometheus::Gauge* mem_kv_pool_;
  prometheus::Gauge* mem_workspace_;
  prometheus::Gauge* mem_adapters_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_METRICS_H_
