#include "server/metrics.h"

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/process.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

// A scripted engine: each test sets what Stats() and DrainLatencies() return next.
struct FakeEngine {
  EngineStats stats;
  Engine::Latencies latencies;
  MemoryUsage memory{1000, 2000, 300};

  MetricsSources Sources() {
    return {[this] { return stats; },
            [this] {
              Engine::Latencies out = latencies;
              latencies = {};
              return out;
            },
            [this] { return memory; }};
  }
};

// The value of one sample line "name{labels} value" in the exposition.
double Value(const std::string& text, const std::string& series) {
  const std::string needle = series + " ";
  size_t pos = 0;
  while ((pos = text.find(needle, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') {
      return std::stod(text.substr(pos + needle.size()));
    }
    pos += needle.size();
  }
  ADD_FAILURE() << "no series " << series << " in:\n" << text;
  return -1;
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
  fake.stats.cache.queried_tokens = 100;
  fake.stats.cache.hit_tokens = 40;
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
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_queried_tokens_total"), 100);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total"), 40);
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
  fake.stats.cache.hit_tokens = 55;
  fake.stats.cache.blocks_active = 0;
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total"), 55);
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_queried_tokens_total"), 100);
  EXPECT_EQ(Value(text, "prefixd_kv_blocks{state=\"active\"}"), 0);

  // A value that went backwards never makes a counter decrease (or double count later).
  fake.stats.cache.hit_tokens = 50;
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total"), 55);
  fake.stats.cache.hit_tokens = 60;
  text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_prefix_cache_hit_tokens_total"), 60);
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

TEST(MetricsTest, RequestsAreCountedByCode) {
  FakeEngine fake;
  ServerMetrics m(fake.Sources());
  EXPECT_EQ(Value(m.ExpositionText(), "prefixd_requests_total{api=\"grpc\",code=\"OK\"}"), 0);
  EXPECT_EQ(Value(m.ExpositionText(), "prefixd_requests_total{api=\"http\",code=\"OK\"}"), 0);
  m.RecordRequest(Api::kGrpc, absl::StatusCode::kOk);
  m.RecordRequest(Api::kGrpc, absl::StatusCode::kOk);
  m.RecordRequest(Api::kGrpc, absl::StatusCode::kInvalidArgument);
  m.RecordRequest(Api::kHttp, absl::StatusCode::kResourceExhausted);
  const std::string text = m.ExpositionText();
  EXPECT_EQ(Value(text, "prefixd_requests_total{api=\"grpc\",code=\"OK\"}"), 2);
  EXPECT_EQ(Value(text, "prefixd_requests_total{api=\"grpc\",code=\"INVALID_ARGUMENT\"}"), 1);
  EXPECT_EQ(Value(text, "prefixd_requests_total{api=\"http\",code=\"RESOURCE_EXHAUSTED\"}"), 1);
}

// The README's metrics table is what dashboards and the deploy config test rely on: every
// metric it lists must be exported (and nothing exported may be missing from it).
TEST(MetricsTest, ExportsExactlyTheReadmeMetricsTable) {
  std::ifstream readme(std::string(PREFIXD_SOURCE_DIR) + "/README.md");
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
  fake.stats.cache.hit_tokens = 3;
  fake.latencies.ttft = {0.1};
  m.RecordRequest(Api::kHttp, absl::StatusCode::kUnavailable);
  testing::TempDir dir;
  const std::string path = dir.path() + "/metrics.txt";
  std::ofstream(path) << m.ExpositionText();
  testing::CommandResult r =
      testing::RunCommand({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + path});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "") << "promtool lint findings";
}

}  // namespace
}  // namespace prefixd
