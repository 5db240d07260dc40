// The remote cache tier through the server: two prefixd servers on one real redis-server
// (as two replicas behind a load balancer) share a prompt bit for bit, and the metrics,
// GetCacheStats and the start-up log say so; bad --kv-remote flags are refused naming the
// flag; a server whose Redis is down starts and serves.
#include <fstream>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/server/grpc_helpers.h"
#include "tests/server/in_process_server.h"
#include "tests/server/process.h"
#include "tests/testing/redis_server.h"

namespace prefixd::testing {
namespace {

using ::testing::HasSubstr;

class ServerRemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = dir_.path() + "/tiny-model";
    ASSERT_TRUE(WriteTinyModel(model_dir_).ok());
    absl::StatusOr<std::unique_ptr<RedisServer>> r = RedisServer::Start({"--requirepass", "pw1"});
    ASSERT_TRUE(r.ok()) << r.status();
    redis_ = *std::move(r);
    password_file_ = dir_.path() + "/redis-password";
    std::ofstream(password_file_) << "pw1\n";
  }

  ServerOptions Options(LogSink* log) {
    ServerOptions o = TestServerOptions(model_dir_, log->Writer());
    o.metrics_listen = "127.0.0.1:0";
    o.engine.remote_tier.url = redis_->url();
    o.engine.remote_tier.timeout = absl::Seconds(2);  // a loaded test machine meets it
    o.kv_remote_password_file = password_file_;
    return o;
  }

  TempDir dir_;
  std::string model_dir_;
  std::string password_file_;
  std::unique_ptr<RedisServer> redis_;
};

TEST_F(ServerRemoteTierTest, TwoServersShareAPromptThroughRedis) {
  const std::vector<uint32_t> prompt = RandomIds(11, 64);  // 4 blocks of 16
  LogSink log_a, log_b;
  absl::StatusOr<std::unique_ptr<Server>> a = Server::Start(Options(&log_a));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(log_a.Text(), HasSubstr("remote cache " + redis_->url()));
  absl::StatusOr<std::unique_ptr<Server>> b = Server::Start(Options(&log_b));
  ASSERT_TRUE(b.ok()) << b.status();

  auto stub_a = v1::Inference::NewStub(InsecureChannel((*a)->grpc_address()));
  GenerateResult cold = Generate(*stub_a, IdsRequest(prompt, 8));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.usage.cached_prompt_tokens(), 0u);
  // Publishing is asynchronous: wait until a's blocks are stored.
  // A loaded machine may take seconds; the deadline only bounds a broken publisher.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (GetStats(*stub_a).remote_stores() < 4 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(GetStats(*stub_a).remote_stores(), 4u);

  auto stub_b = v1::Inference::NewStub(InsecureChannel((*b)->grpc_address()));
  GenerateResult warm = Generate(*stub_b, IdsRequest(prompt, 8));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  // All 4 blocks from Redis; the last prompt token is computed again for its logits.
  EXPECT_EQ(warm.usage.cached_prompt_tokens(), 63u);
  EXPECT_EQ(warm.samples[0].token_ids, cold.samples[0].token_ids);
  EXPECT_EQ(warm.samples[0].logprobs, cold.samples[0].logprobs);

  absl::StatusOr<std::string> text = HttpGet((*b)->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(MetricValue(*text, "prefixd_remote_cache_hit_tokens_total"), 63);
  EXPECT_EQ(MetricValue(*text, "prefixd_prefix_cache_hit_tokens_total"), 63);
  EXPECT_EQ(MetricValue(*text, "prefixd_remote_cache_loads_total"), 4);
  EXPECT_EQ(MetricValue(*text, "prefixd_remote_cache_corrupt_blocks_total"), 0);
  EXPECT_EQ(MetricValue(*text, "prefixd_remote_cache_match_timeouts_total"), 0);
  EXPECT_EQ(MetricValue(*text, "prefixd_remote_cache_load_seconds_count"), 4);
  EXPECT_EQ(MetricValue(*text, "prefixd_remote_cache_up"), 1);
  EXPECT_EQ(MetricValue(*text, "prefixd_remote_cache_errors_total{op=\"connect\"}"), 0);
  const v1::CacheStats stats = GetStats(*stub_b);
  EXPECT_TRUE(stats.remote_configured());
  EXPECT_TRUE(stats.remote_up());
  EXPECT_EQ(stats.remote_hit_tokens(), 63u);
  EXPECT_EQ(stats.remote_loads(), 4u);
  EXPECT_EQ(stats.hit_tokens(), 63u);
}

TEST_F(ServerRemoteTierTest, ADownRedisCostsHitsNotRequests) {
  redis_->Kill();
  LogSink log;
  absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(Options(&log));
  ASSERT_TRUE(s.ok()) << s.status();
  auto stub = v1::Inference::NewStub(InsecureChannel((*s)->grpc_address()));
  for (int i = 0; i < 3; ++i) {
    const GenerateResult out = Generate(*stub, IdsRequest(RandomIds(20 + i, 40), 4));
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  }
  absl::StatusOr<std::string> text = HttpGet((*s)->metrics_port(), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(MetricValue(*text, "prefixd_remote_cache_up"), 0);
  EXPECT_GE(MetricValue(*text, "prefixd_remote_cache_errors_total{op=\"connect\"}"), 1);
  EXPECT_THAT(log.Text(), HasSubstr("remote cache tier: "));
  EXPECT_FALSE(GetStats(*stub).remote_up());
}

TEST_F(ServerRemoteTierTest, BadFlagsAreRefusedNamingTheFlag) {
  struct Case {
    std::function<void(ServerOptions&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](ServerOptions& o) { o.engine.remote_tier.url = "redis://host"; }, "--kv-remote"},
      {[](ServerOptions& o) { o.engine.remote_tier.url = "redis://:pw@host:1"; }, "--kv-remote-password-file"},
      {[](ServerOptions& o) { o.engine.enable_prefix_cache = false; }, "--no-prefix-cache"},
      {[](ServerOptions& o) { o.engine.remote_tier.timeout = absl::ZeroDuration(); }, "--kv-remote-timeout"},
      {[](ServerOptions& o) { o.engine.remote_tier.key_prefix = "a b"; }, "--kv-remote-prefix"},
      {[](ServerOptions& o) {
         o.engine.remote_tier.url.clear();
       },
       "--kv-remote-password-file needs --kv-remote"},
      {[this](ServerOptions& o) { o.kv_remote_password_file = dir_.path() + "/absent"; },
       "--kv-remote-password-file"},
  };
  for (const Case& c : cases) {
    LogSink log;
    ServerOptions o = Options(&log);
    c.set(o);
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(std::move(o));
    ASSERT_FALSE(s.ok()) << c.message;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace prefixd::testing
