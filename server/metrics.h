// Prometheus metrics of prefixd, collected on scrape: each scrape first pulls the engine's
// Stats() (counters advance by the delta since the previous scrape) and DrainLatencies()
// (observations go into the histograms), then serializes. No collector thread, and nothing
// is read from the engine between scrapes.
//
// Counters only ever increase: a delta is applied only when the engine's cumulative value
// grew. Every metric and its formula are listed in docs/SERVER.md.
#ifndef PREFIXD_SERVER_METRICS_H_
#define PREFIXD_SERVER_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "server/api.h"
#include "absl/status/status.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace prefixd {

struct MetricsSources {
  std::function<EngineStats()> stats;
  std::function<Engine::Latencies()> latencies;
  std::function<MemoryUsage()> memory;
  // Host bytes of the loaded LoRA adapters (server/adapter_registry.h); unset: none.
  std::function<int64_t()> adapter_bytes;
};

class ServerMetrics : public prometheus::Collectable {
 public:
  explicit ServerMetrics(MetricsSources sources);

  // One finished generate request (a gRPC Generate call, an HTTP completion's prompt), by
  // front end and status code (named as gRPC names it, whichever the front end).
  void RecordRequest(Api api, absl::StatusCode code);

  // Refreshes from the sources, then returns every family (the Exposer calls this per scrape).
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
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* tpot_;
  prometheus::Gauge* disk_bytes_;
  prometheus::Gauge* disk_cap_bytes_;
  prometheus::Gauge* disk_blocks_;
  prometheus::Histogram* disk_load_;
  prometheus::Gauge* remote_up_;
  prometheus::Histogram* remote_load_;
  prometheus::Gauge* mem_weights_;
  prometheus::Gauge* mem_kv_pool_;
  prometheus::Gauge* mem_workspace_;
  prometheus::Gauge* mem_adapters_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_METRICS_H_
