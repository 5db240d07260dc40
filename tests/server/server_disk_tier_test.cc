// The disk cache tier through the server: a restart on the same --cache-dir serves the
// prompt cached before it, bit for bit, and says so in cached_prompt_tokens and the metrics;
// a second server on a directory in use refuses to start.
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;

class ServerDiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = dir_.path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
  }

  absl::StatusOr<std::unique_ptr<Server>> StartServer(LogSink* log) {
    ServerOptions o = TestServerOptions(model_dir_, log->Writer());
    o.metrics_listen = "127.0.0.1:0";
    o.engine.disk_tier.dir = dir_.path() + "/kv-cache";
    return Server::Start(std::move(o));
  }

  TempDir dir_;
  std::string model_dir_;
};

TEST_F(ServerDiskTierTest, ARestartServesThePromptCachedBeforeIt) {
  const std::vector<uint32_t> prompt = RandomIds(7, 64);  // 4 blocks of 16
  GenerateResult cold;
  {
    LogSink log;
    absl::StatusOr<std::unique_ptr<Server>> first = StartServer(&log);
    ASSERT_TRUE(first.ok()) << first.status();
    auto stub = v1::Inference::NewStub(InsecureChannel((*first)->grpc_address()));
    cold = Generate(*stub, IdsRequest(prompt, 8));
    ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
    EXPECT_EQ(cold.usage.cached_prompt_tokens(), 0u);
    // The drain writes the blocks still cached in the pool to the tier.
    (*first)->BeginDrain(absl::Seconds(10));
    ASSERT_TRUE((*first)->Wait().ok());
  }
  LogSink log;
  absl::StatusOr<std::unique_ptr<Server>> second = StartServer(&log);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(log.Text(), HasSubstr("disk cache " + dir_.path() + "/kv-cache: 4 blocks"));
  auto stub = v1::Inference::NewStub(InsecureChannel((*second)->grpc_address()));
  GenerateResult warm = Generate(*stub, IdsRequest(prompt, 8));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  // All 4 blocks come back from disk; the last prompt token is computed again for its logits.
  EXPECT_EQ(warm.usage.cached_prompt_tokens(), 63u);
  // ... and where from: the disk tier's 4 blocks less the recomputed last token.
  EXPECT_EQ(warm.usage.cached_disk_tokens(), 63u);
  EXPECT_EQ(warm.usage.cached_pool_tokens(), 0u);
  EXPECT_EQ(warm.usage.cached_remote_tokens(), 0u);
  EXPECT_EQ(warm.samples[0].token_ids, cold.samples[0].token_ids);
  EXPECT_EQ(warm.samples[0].logprobs, cold.samples[0].logprobs);

  absl::StatusOr<std::string> text = HttpGet((*second)->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(MetricValue(*text, "prefixd_disk_cache_hit_tokens_total"), 63);
  EXPECT_EQ(MetricValue(*text, "prefixd_prefix_cache_hit_tokens_total"), 63);
  EXPECT_EQ(MetricValue(*text, "prefixd_disk_cache_loads_total"), 4);
  EXPECT_EQ(MetricValue(*text, "prefixd_disk_cache_corrupt_blocks_total"), 0);
  EXPECT_EQ(MetricValue(*text, "prefixd_disk_cache_load_seconds_count"), 4);
  EXPECT_EQ(MetricValue(*text, "prefixd_disk_cache_blocks"), 4);
  EXPECT_EQ(MetricValue(*text, "prefixd_disk_cache_queued_blocks"), 0);  // nothing evicted
  const v1::CacheStats stats = GetStats(*stub);
  EXPECT_EQ(stats.hit_tokens(), 63u);
  // GetCacheStats says the same as the metrics, and what the tier holds.
  EXPECT_EQ(stats.disk_hit_tokens(), 63u);
  EXPECT_EQ(stats.disk_loads(), 4u);
  EXPECT_EQ(stats.disk_blocks(), 4u);
  EXPECT_EQ(stats.disk_corrupt_blocks(), 0u);
  EXPECT_EQ(stats.disk_spills(), 0u);  // this server has evicted nothing yet
  EXPECT_EQ(static_cast<double>(stats.disk_bytes()),
            MetricValue(*text, "prefixd_disk_cache_bytes{kind=\"used\"}"));
  EXPECT_EQ(static_cast<double>(stats.disk_cap_bytes()),
            MetricValue(*text, "prefixd_disk_cache_bytes{kind=\"cap\"}"));
  EXPECT_GT(stats.disk_bytes(), 0u);
  EXPECT_GE(stats.disk_cap_bytes(), stats.disk_bytes());

  // The directory is in use: another server on it refuses to start, saying why.
  LogSink other_log;
  absl::StatusOr<std::unique_ptr<Server>> other = StartServer(&other_log);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("kv-cache"));
}

TEST_F(ServerDiskTierTest, BadCacheDirOptionsAreRefusedNamingTheFlag) {
  ServerOptions o = TestServerOptions(model_dir_);
  o.engine.disk_tier.dir = dir_.path() + "/kv-cache";
  o.engine.enable_prefix_cache = false;
  EXPECT_THAT(std::string(Server::Start(o).status().message()),
              HasSubstr("--cache-dir needs the prefix cache"));
  o.engine.enable_prefix_cache = true;
  o.engine.disk_tier.max_bytes = -1;
  EXPECT_THAT(std::string(Server::Start(o).status().message()),
              HasSubstr("--cache-dir-bytes must be 0 (the default cap) or positive, got -1"));
}

}  // namespace
}  // namespace prefixd::testing
