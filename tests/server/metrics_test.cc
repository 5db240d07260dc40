#include "server/metrics.h"

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <variant>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics_endpoint.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/process.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

// A scripted engine and adapter registry: each test sets what Stats(), DrainLatencies(),
// DrainAdapterTokens() and the loaded names return next.
struct FakeEngine {
  EngineStats stats;
  Engine::Latencies latencies;
  AdapterTokenCounts tokens;
  std::vector<std::string> loaded;
  MemoryUsage memory{1000, 2000, 300};

  MetricsSources Sources() {
    return {.stats = [this] { return stats; },
            .latencies =
                [this] {
                  Engine::Latencies out = latencies;
                  latencies = {};
                  return out;
                },
            .memory = [this] { return memory; },
            .adapter_tokens =
                [this] {
                  AdapterTokenCounts out = tokens;
                  tokens.clear();
                  return out;
                },
            .adapter_names = [this] { return loaded; },
            .base_name = "gpt2",
            .tenant_labels = {"quiet", "noisy"}};
  }
};

// The sum of the samples with that name and those labels (tests/server/grpc_helpers.h).
double Value(const std::string& text, const std::string& series) {
  const double v = testing::MetricValue(text, series);
  if (v < 0) ADD_FAILURE() << "no series " << series << " in:\n" << text;
  return v;
}

// The `adapter` label values of a family's series in the exposition.
std::set<std::string> AdapterLabels(const std::string& text, const std::string& family) {
  std::set<std::string> out;
  static const std::regex kAdapter(R"re(adapter="([^"]*)")re");
  std::istringstream lines(text);
  std::smatch match;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(family + "{", 0) != 0) continue;
    if (std::regex_search(line, match, kAdapter)) out.insert(match[1]);
  }
  return out;
}

// kind="adapters" is the registry's host tensors plus the backend's own copies (the CUDA
// backend's device copies, MemoryUsage::adapter_bytes).
TEST(MetricsTest, AdapterBytesAddHostTensorsAndBackendCopies) {
  MemoryUsage memory{1000, 2000, 300, 4096};
  MetricsSources sources;
  sources.memory = [&] { return memory; };
  sources.adapter_bytes = [] { return int64_t{500}; };
  ServerMetrics m(sources);
  std::string text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_memory_bytes{kind=\"adapters\"}"), 4596);
  EXPECT_EQ(Value(text, "prefixd_memory_bytes{kind=\"workspace\"}"), 300);
  memory.adapter_bytes = 0;  // evicted from the device
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_memory_bytes{kind=\"adapters\"}"), 500);
}

TEST(MetricsTest, CountersFollowEngineDeltasAndGaugesItsState) {
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  fake.tokens[""] = {.queried_tokens = 100, .hit_tokens = 40};
  fake.stats.cache.blocks_total = 10;
  fake.stats.cache.blocks_free = 5;
  fake.stats.cache.blocks_active = 2;
  fake.stats.cache.blocks_cached = 3;
  fake.stats.cache.pool_bytes = 10240;
  fake.stats.cache.bytes_per_token = 64;
  fake.stats.cache.evictions = 1;
  fake.stats.cache.cow_copies = 2;
  fake.stats.cache.cow_rows = 9;
  fake.stats.scheduler.prefill_tokens = 60;
  fake.stats.scheduler.generated_tokens = 7;
  fake.stats.scheduler.preemptions = 1;
  fake.stats.scheduler.running_requests = 2;
  fake.stats.scheduler.waiting_requests = 4;
  std::string text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_queried_tokens_total{adapter=\"gpt2\"}"), 100);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total{adapter=\"gpt2\"}"), 40);
  EXPECT_EQ(Value(text, "prefixd_kv_blocks{state=\"free\"}"), 5);
  EXPECT_EQ(Value(text, "prefixd_kv_blocks{state=\"active\"}"), 2);
  EXPECT_EQ(Value(text, "prefixd_kv_blocks{state=\"cached\"}"), 3);
  EXPECT_EQ(Value(text, "prefixd_kv_pool_bytes"), 10240);
  EXPECT_EQ(Value(text, "prefixd_kv_cache_usage_ratio"), 0.2);  // 2 active of 10
  EXPECT_EQ(Value(text, "prefixd_kv_bytes_per_token"), 64);
  EXPECT_EQ(Value(text, "prefixd_kv_evictions_total"), 1);
  EXPECT_EQ(Value(text, "prefixd_kv_cow_copies_total"), 2);
  EXPECT_EQ(Value(text, "prefixd_kv_cow_rows_total"), 9);
  EXPECT_EQ(Value(text, "prefixd_prefill_tokens_total"), 60);
  EXPECT_EQ(Value(text, "prefixd_generated_tokens_total"), 7);
  EXPECT_EQ(Value(text, "prefixd_preemptions_total"), 1);
  EXPECT_EQ(Value(text, "prefixd_running_requests"), 2);
  EXPECT_EQ(Value(text, "prefixd_waiting_requests"), 4);
  EXPECT_EQ(Value(text, "prefixd_memory_bytes{kind=\"weights\"}"), 1000);
  EXPECT_EQ(Value(text, "prefixd_memory_bytes{kind=\"kv_pool\"}"), 2000);
  EXPECT_EQ(Value(text, "prefixd_memory_bytes{kind=\"workspace\"}"), 300);

  // The next scrape adds only what changed; gauges follow the current state.
  fake.tokens[""] = {.queried_tokens = 0, .hit_tokens = 15};
  fake.stats.cache.blocks_active = 0;
  fake.stats.cache.evictions = 4;
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total"), 55);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_queried_tokens_total"), 100);
  EXPECT_EQ(Value(text, "prefixd_kv_evictions_total"), 4);
  EXPECT_EQ(Value(text, "prefixd_kv_blocks{state=\"active\"}"), 0);

  // A value that went backwards never makes a counter decrease (or double count later).
  fake.stats.cache.evictions = 3;
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_kv_evictions_total"), 4);
  fake.stats.cache.evictions = 6;
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_kv_evictions_total"), 6);
}

TEST(MetricsTest, HistogramsTakeEachDrainedLatencyOnce) {
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  fake.latencies.ttft = {0.003, 0.2};
  fake.latencies.tpot = {0.002, 0.002, 0.5};
  std::string text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_time_to_first_token_seconds_count"), 2);
  EXPECT_DOUBLE_EQ(Value(text, "prefixd_time_to_first_token_seconds_sum"), 0.203);
  EXPECT_EQ(Value(text, "prefixd_time_to_first_token_seconds_bucket{le=\"0.005\"}"), 1);
  EXPECT_EQ(Value(text, "prefixd_time_per_output_token_seconds_count"), 3);
  EXPECT_EQ(Value(text, "prefixd_time_per_output_token_seconds_bucket{le=\"0.0025\"}"), 2);
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_time_to_first_token_seconds_count"), 2);
}

// Per-tenant series: named tenants by name (at 0 from the start), the rest summed as
// "other"; counters follow each tenant's cumulative values.
TEST(MetricsTest, TenantSeriesAreBoundedByTheNamedTenants) {
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  std::string text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_tenant_pool_hit_tokens_total{tenant=\"noisy\"}"), 0);
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"quiet\"}"), 0);
  fake.stats.tenants = {{"quiet", {.cached_blocks = 4, .hit_tokens = 100, .evictions = 0}},
                        {"noisy", {.cached_blocks = 9, .hit_tokens = 0, .evictions = 30}},
                        {"x", {.cached_blocks = 1, .hit_tokens = 5, .evictions = 2}},
                        {"y", {.cached_blocks = 2, .hit_tokens = 7, .evictions = 1}}};
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"quiet\"}"), 4);
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"other\"}"), 3);
  EXPECT_EQ(Value(text, "prefixd_tenant_pool_hit_tokens_total{tenant=\"quiet\"}"), 100);
  EXPECT_EQ(Value(text, "prefixd_tenant_pool_hit_tokens_total{tenant=\"other\"}"), 12);
  EXPECT_EQ(Value(text, "prefixd_tenant_evictions_total{tenant=\"noisy\"}"), 30);
  fake.stats.tenants[3].second.evictions = 4;
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_tenant_evictions_total{tenant=\"other\"}"), 6);
  EXPECT_EQ(Value(text, "prefixd_tenant_evictions_total{tenant=\"noisy\"}"), 30);
  // Relabelled (a reload): "x" now has its own series from its next growth on.
  m.SetTenantLabels({"quiet", "noisy", "x"});
  fake.stats.tenants[2].second.hit_tokens = 8;
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_tenant_pool_hit_tokens_total{tenant=\"x\"}"), 3);
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"other\"}"), 2);
}

// A reload that takes a tenant's name away (or names every tenant "other" held) leaves no
// cached-blocks gauge at its last value: summed over `tenant` the gauge is the pool's cached
// blocks, each counted once.
TEST(MetricsTest, TenantCachedGaugeOfALabelNoLongerUsedIsNotLeftBehind) {
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  fake.stats.tenants = {{"quiet", {.cached_blocks = 4}},
                        {"noisy", {.cached_blocks = 9}},
                        {"x", {.cached_blocks = 1}}};
  std::string text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"noisy\"}"), 9);
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"other\"}"), 1);

  // "noisy" leaves the tokens file; "x" gets a line of its own: nobody is "other" now.
  m.SetTenantLabels({"quiet", "x"});
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"x\"}"), 1);
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"other\"}"), 9);  // noisy's
  EXPECT_EQ(testing::MetricValue(text, "prefixd_tenant_cached_blocks{tenant=\"noisy\"}"), -1);
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks"), 14);

  // Every tenant named: "other" holds nothing.
  m.SetTenantLabels({"quiet", "noisy", "x"});
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks{tenant=\"noisy\"}"), 9);
  EXPECT_EQ(testing::MetricValue(text, "prefixd_tenant_cached_blocks{tenant=\"other\"}"), -1);
  EXPECT_EQ(Value(text, "prefixd_tenant_cached_blocks"), 14);
}

// The residency histograms take the engine's block observations (engine/block_residency.h).
TEST(MetricsTest, ResidencyHistogramsTakeTheBlockObservations) {
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  fake.latencies.block_lifetime = {20, 4000};
  fake.latencies.block_idle_before_eviction = {0.05, 3000};
  fake.latencies.block_reuse_gap = {0.2, 0.3, 90};
  const std::string text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_kv_block_lifetime_seconds_count"), 2);
  EXPECT_EQ(Value(text, "prefixd_kv_block_lifetime_seconds_bucket{le=\"30\"}"), 1);
  EXPECT_EQ(Value(text, "prefixd_kv_block_lifetime_seconds_sum"), 4020);
  EXPECT_EQ(Value(text, "prefixd_kv_block_idle_before_evict_seconds_bucket{le=\"0.1\"}"), 1);
  EXPECT_EQ(Value(text, "prefixd_kv_block_idle_before_evict_seconds_count"), 2);
  EXPECT_EQ(Value(text, "prefixd_kv_block_reuse_gap_seconds_bucket{le=\"0.5\"}"), 2);
  EXPECT_EQ(Value(text, "prefixd_kv_block_reuse_gap_seconds_count"), 3);
}

TEST(MetricsTest, RequestsAreCountedByCode) {
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  const std::string first = m.ExpositionText();
  EXPECT_THAT(first,
              HasSubstr("prefixd_requests_total{adapter=\"gpt2\",api=\"grpc\",code=\"OK\"} 0\n"));
  EXPECT_THAT(first,
              HasSubstr("prefixd_requests_total{adapter=\"gpt2\",api=\"http\",code=\"OK\"} 0\n"));
  m.RecordRequest(Api::kGrpc, absl::StatusCode::kOk, "gpt2");
  m.RecordRequest(Api::kGrpc, absl::StatusCode::kOk, "gpt2");
  m.RecordRequest(Api::kGrpc, absl::StatusCode::kInvalidArgument, "gpt2");
  m.RecordRequest(Api::kHttp, absl::StatusCode::kResourceExhausted, "gpt2");
  m.RecordRequest(Api::kHttp, absl::StatusCode::kNotFound, kUnresolvedAdapter);
  const std::string text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_requests_total{api=\"grpc\",code=\"OK\"}"), 2);
  EXPECT_EQ(Value(text, "prefixd_requests_total{api=\"grpc\",code=\"INVALID_ARGUMENT\"}"), 1);
  EXPECT_EQ(Value(text, "prefixd_requests_total{api=\"http\",code=\"RESOURCE_EXHAUSTED\"}"), 1);
  EXPECT_THAT(
      text, HasSubstr("prefixd_requests_total{adapter=\"\",api=\"http\",code=\"NOT_FOUND\"} 1\n"));
}

TEST(MetricsTest, CountsAreLabelledByAdapterAndSumToTheTotals) {
  FakeEngine fake;
  fake.loaded = {"fr", "de"};
  ServerMetrics m(fake.Sources());
  // Loaded adapters' series are there at 0 from the first scrape.
  std::string text = m.ExpositionText();
  EXPECT_EQ(AdapterLabels(text, "prefixd_prefix_cache_hit_tokens_total"),
            (std::set<std::string>{"gpt2", "fr", "de"}));
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total{adapter=\"fr\"}"), 0);
  EXPECT_EQ(Value(text, "prefixd_requests_total{adapter=\"de\",api=\"http\",code=\"OK\"}"), 0);

  fake.tokens[""] = {.queried_tokens = 10, .hit_tokens = 0};
  fake.tokens["fr"] = {.queried_tokens = 20, .hit_tokens = 12};
  fake.tokens["de"] = {.queried_tokens = 7, .hit_tokens = 3};
  m.RecordRequest(Api::kGrpc, absl::StatusCode::kOk, "fr");
  m.RecordRequest(Api::kHttp, absl::StatusCode::kOk, "fr");
  m.RecordRequest(Api::kHttp, absl::StatusCode::kOk, "gpt2");
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_queried_tokens_total{adapter=\"gpt2\"}"), 10);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total{adapter=\"gpt2\"}"), 0);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_queried_tokens_total{adapter=\"fr\"}"), 20);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total{adapter=\"fr\"}"), 12);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total{adapter=\"de\"}"), 3);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_queried_tokens_total"), 37);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total"), 15);
  EXPECT_EQ(Value(text, "prefixd_requests_total{adapter=\"fr\"}"), 2);
  EXPECT_EQ(Value(text, "prefixd_requests_total{code=\"OK\"}"), 3);

  // Unloaded: its series are exported while there is something new (the counts of requests
  // that held it), then removed by the first scrape with nothing new for it.
  fake.loaded = {"de"};
  fake.tokens["fr"] = {.queried_tokens = 5, .hit_tokens = 5};
  m.RecordRequest(Api::kGrpc, absl::StatusCode::kCancelled, "fr");
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total{adapter=\"fr\"}"), 17);
  EXPECT_EQ(Value(text, "prefixd_requests_total{adapter=\"fr\"}"), 3);
  text = m.ExpositionText();
  EXPECT_EQ(AdapterLabels(text, "prefixd_prefix_cache_hit_tokens_total"),
            (std::set<std::string>{"gpt2", "de"}));
  EXPECT_EQ(AdapterLabels(text, "prefixd_requests_total"), (std::set<std::string>{"gpt2", "de"}));
  // Loaded again: new series from 0.
  fake.loaded = {"de", "fr"};
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total{adapter=\"fr\"}"), 0);
}

// Loading and unloading names by the hundred leaves the series of the base, of "" and of
// the names loaded now: never more than --max-adapters + 2 label values once scraped.
TEST(MetricsTest, LoadUnloadStormLeavesBoundedSeries) {
  constexpr int kMaxAdapters = 3;
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  m.RecordRequest(Api::kHttp, absl::StatusCode::kNotFound, kUnresolvedAdapter);
  for (int i = 0; i < 300; ++i) {
    const std::string name = "storm-" + std::to_string(i);
    fake.loaded.push_back(name);
    if (fake.loaded.size() > kMaxAdapters) fake.loaded.erase(fake.loaded.begin());
    fake.tokens[name] = {.queried_tokens = 4, .hit_tokens = 2};
    m.RecordRequest(Api::kGrpc, absl::StatusCode::kOk, name);
    const std::string text = m.ExpositionText();
    EXPECT_LE(AdapterLabels(text, "prefixd_requests_total").size(), kMaxAdapters + 2u) << i;
    EXPECT_LE(AdapterLabels(text, "prefixd_prefix_cache_hit_tokens_total").size(),
              kMaxAdapters + 1u)
        << i;
  }
  fake.loaded.clear();
  m.ExpositionText();
  const std::string text = m.ExpositionText();
  EXPECT_EQ(AdapterLabels(text, "prefixd_requests_total"), (std::set<std::string>{"", "gpt2"}));
  EXPECT_EQ(AdapterLabels(text, "prefixd_prefix_cache_hit_tokens_total"),
            (std::set<std::string>{"gpt2"}));
}

// docs/SERVER.md's metrics table (the one the README links to) is what dashboards and the
// deploy config test rely on: every metric it lists must be exported (and nothing exported may
// be missing from it).
TEST(MetricsTest, ExportsExactlyTheDocumentedMetricsTable) {
  std::ifstream readme(std::string(PREFIXD_SOURCE_DIR) + "/docs/SERVER.md");
  ASSERT_TRUE(readme.good());
  std::set<std::string> documented;
  static const std::regex kRow(R"(^\| `(prefixd_[a-z0-9_]+)[`{])");
  std::smatch match;
  for (std::string line; std::getline(readme, line);) {
    if (std::regex_search(line, match, kRow)) documented.insert(match[1]);
  }
  ASSERT_GE(documented.size(), 16u);

  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  std::set<std::string> exported;
  std::istringstream text(m.ExpositionText());
  static const std::regex kType(R"(^# TYPE (prefixd_[a-z0-9_]+) )");
  for (std::string line; std::getline(text, line);) {
    if (std::regex_search(line, match, kType)) exported.insert(match[1]);
  }
  EXPECT_EQ(exported, documented);
}

TEST(MetricsTest, ExpositionPassesPromtool) {
  if (access("/usr/bin/promtool", X_OK) != 0) GTEST_SKIP() << "promtool not installed";
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  fake.loaded = {"fr"};
  fake.tokens["fr"] = {.queried_tokens = 4, .hit_tokens = 3};
  fake.latencies.ttft = {0.1};
  m.RecordRequest(Api::kHttp, absl::StatusCode::kUnavailable, "gpt2");
  m.RecordRequest(Api::kHttp, absl::StatusCode::kNotFound, kUnresolvedAdapter);
  testing::TempDir dir;
  const std::string path = dir.path() + "/metrics.txt";
  std::ofstream(path) << m.ExpositionText();
  testing::CommandResult r =
      testing::RunCommand({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + path});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "") << "promtool lint findings";
}

// The metrics listener's handler: GET and HEAD /metrics (a query is ignored) get the text
// exposition in Prometheus' content type; another path is 404, another method 405.
TEST(MetricsEndpointTest, ServesTheExpositionAtMetricsOnly) {
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  MetricsEndpoint endpoint(&m);
  const std::string no_body;
  for (const char* method : {"GET", "HEAD"}) {
    for (const char* target : {"/metrics", "/metrics?name=x"}) {
      HttpRouted routed = endpoint.Route({.method = method, .target = target, .body = &no_body});
      HttpReply* reply = std::get_if<HttpReply>(&routed);
      ASSERT_NE(reply, nullptr);
      EXPECT_EQ(reply->status, 200) << method << " " << target;
      EXPECT_EQ(reply->content_type, "text/plain; version=0.0.4; charset=utf-8");
      EXPECT_THAT(reply->body, HasSubstr("# TYPE prefixd_kv_pool_bytes gauge"));
    }
  }
  for (const auto& [method, target, status] :
       {std::tuple<const char*, const char*, int>{"GET", "/health", 404},
        {"GET", "/metricsx", 404},
        {"POST", "/metrics", 405}}) {
    HttpRouted routed = endpoint.Route({.method = method, .target = target, .body = &no_body});
    HttpReply* reply = std::get_if<HttpReply>(&routed);
    ASSERT_NE(reply, nullptr);
    EXPECT_EQ(reply->status, status) << method << " " << target;
    EXPECT_EQ(reply->content_type, "application/json");
    EXPECT_THAT(reply->body, HasSubstr("GET /metrics"));
  }
}

}  // namespace
}  // namespace prefixd
