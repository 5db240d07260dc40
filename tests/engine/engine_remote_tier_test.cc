// The remote (Redis) cache tier end to end: two CPU engines on one tiny random GPT-2 share a
// prompt through a real redis-server, and every output is compared with a cold engine's bit
// for bit (==): after a remote hit, after every stored value was damaged, with another
// dtype's engine on the same Redis, with Redis killed and restarted, and with Redis full.
#include <atomic>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/cpu_engine_fixture.h"
#include "tests/engine/engine_test_peer.h"
#include "tests/engine/engine_test_util.h"
#include "tests/testing/delay_proxy.h"
#include "tests/testing/redis_server.h"

namespace prefixd {
namespace {

using ::prefixd::testing::DelayProxy;
using ::prefixd::testing::RedisServer;

constexpr absl::Duration kWait = absl::Seconds(30);

// 100 prompt tokens: 6 whole blocks of 16 (96 tokens) can come from the remote tier.
EngineRequest Request(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> tok(0, 50255);
  EngineRequest r;
  for (int i = 0; i < 100; ++i) r.prompt.push_back(tok(rng));
  r.max_new_tokens = 12;
  r.ignore_eos = true;
  r.top_logprobs = 2;
  r.cache_namespace = "tenant-a";
  return r;
}

RequestResult Cold(const EngineRequest& r, DType dtype = DType::kF32) {
  CpuEngine cold({.pool_blocks = 64, .prefix_cache = false, .dtype = dtype});
  return RunOne(*cold.engine, r);
}

CpuEngineOptions WithRemote(const std::string& url, DType dtype = DType::kF32) {
  CpuEngineOptions o{.pool_blocks = 32, .block_size = 16, .dtype = dtype};
  o.remote_tier.url = url;
  o.remote_tier.timeout = absl::Seconds(2);  // a loaded test machine meets it
  o.remote_tier.backoff_min = absl::Milliseconds(50);
  o.remote_tier.backoff_max = absl::Milliseconds(50);
  return o;
}

// Runs `r` on a fresh engine on `url` and waits until its blocks are published.
RequestResult RunAndPublish(const std::string& url, const EngineRequest& r,
                            DType dtype = DType::kF32) {
  CpuEngine engine(WithRemote(url, dtype));
  RequestResult out = RunOne(*engine.engine, r);
  EXPECT_TRUE(EngineTestPeer::FlushRemoteTier(*engine.engine, absl::Now() + kWait));
  return out;
}

std::vector<std::string> Keys(const RedisServer& redis) {
  const std::string all = redis.Command({"KEYS", "*"});
  if (all.empty()) return {};
  return absl::StrSplit(all, '\n');
}

// While `parked` waits (it has emitted nothing and is the one waiting request), the engine
// generates 20 more tokens for the others.
void ExpectOthersDecodeWhileParked(Engine& engine, RequestStream& parked, absl::Time deadline) {
  const uint64_t generated = engine.Stats().scheduler.generated_tokens;
  while (engine.Stats().scheduler.generated_tokens < generated + 20 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GE(engine.Stats().scheduler.generated_tokens, generated + 20);
  std::vector<RequestEvent> events;
  parked.Poll(&events);
  EXPECT_TRUE(events.empty()) << "the parked request has not started";
  EXPECT_EQ(engine.Stats().scheduler.waiting_requests, 1u);
}

class EngineRemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisServer>> s = RedisServer::Start(extra_);
    ASSERT_TRUE(s.ok()) << s.status();
    redis_ = *std::move(s);
  }
  std::vector<std::string> extra_;
  std::unique_ptr<RedisServer> redis_;
};

TEST_F(EngineRemoteTierTest, ASecondEngineGetsThePrefixFromRedisBitIdenticalToCold) {
  const EngineRequest a = Request(1);
  const RequestResult first = RunAndPublish(redis_->url(), a);
  ASSERT_TRUE(first.status.ok()) << first.status;
  // 100 prompt + 11 computed generated tokens: 6 whole blocks, each published once.
  EXPECT_EQ(Keys(*redis_).size(), 6u);

  CpuEngine second(WithRemote(redis_->url()));
  const RequestResult warm = RunOne(*second.engine, a);
  ASSERT_TRUE(warm.status.ok()) << warm.status;
  EXPECT_EQ(warm.usage.cached_prompt_tokens, 96u);
  const EngineStats s = second.engine->Stats();
  EXPECT_EQ(s.scheduler.remote_hit_tokens, 96u);
  EXPECT_EQ(HitTokens(s), 96u);
  EXPECT_EQ(s.remote.loads, 6u);
  EXPECT_EQ(s.remote.corrupt_blocks, 0u);
  EXPECT_TRUE(s.remote.up);
  EXPECT_EQ(second.engine->DrainLatencies().remote_load.size(), 6u);
  const RequestResult cold = Cold(a);
  ASSERT_EQ(warm.samples.size(), 1u);
  EXPECT_EQ(warm.samples[0], cold.samples[0]);
  EXPECT_EQ(first.samples[0], cold.samples[0]);
  // Another tenant's request for the same text finds nothing (the root key differs).
  EngineRequest b = a;
  b.cache_namespace = "tenant-b";
  const RequestResult other = RunOne(*second.engine, b);
  EXPECT_EQ(other.usage.cached_prompt_tokens, 0u);
}

TEST_F(EngineRemoteTierTest, DamagedValuesAreNeverUsed) {
  const EngineRequest a = Request(2);
  ASSERT_TRUE(RunAndPublish(redis_->url(), a).status.ok());
  const std::vector<std::string> keys = Keys(*redis_);
  ASSERT_EQ(keys.size(), 6u);
  for (const std::string& k : keys) {
    // One byte near the end of the K/V data of every block.
    const std::string len = redis_->Command({"STRLEN", k});
    ASSERT_EQ(redis_->Command({"SETRANGE", k, std::to_string(std::stoll(len) - 40), "\x7f"}), len);
  }
  CpuEngine second(WithRemote(redis_->url()));
  const RequestResult out = RunOne(*second.engine, a);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.usage.cached_prompt_tokens, 0u);  // the first block fails: all computed
  EXPECT_EQ(second.engine->Stats().remote.corrupt_blocks, 1u);
  EXPECT_EQ(second.engine->Stats().remote.loads, 0u);
  EXPECT_EQ(out.samples[0], Cold(a).samples[0]);
}

TEST_F(EngineRemoteTierTest, EnginesOfOtherNumericsShareARedisWithoutSharingBlocks) {
  const EngineRequest a = Request(3);
  ASSERT_TRUE(RunAndPublish(redis_->url(), a, DType::kF32).status.ok());
  CpuEngine f16(WithRemote(redis_->url(), DType::kF16));
  const RequestResult out = RunOne(*f16.engine, a);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(f16.engine->Stats().remote.corrupt_blocks, 0u);  // other keys, not damage
  EXPECT_EQ(out.samples[0], Cold(a, DType::kF16).samples[0]);
  ASSERT_TRUE(EngineTestPeer::FlushRemoteTier(*f16.engine, absl::Now() + kWait));
  EXPECT_EQ(Keys(*redis_).size(), 12u);  // each layout's 6 blocks
}

TEST_F(EngineRemoteTierTest, RedisKilledMidRunAndRestartedNeverFailsARequest) {
  CpuEngine engine(WithRemote(redis_->url()));
  const EngineRequest a = Request(4);
  ASSERT_TRUE(RunOne(*engine.engine, a).status.ok());
  ASSERT_TRUE(EngineTestPeer::FlushRemoteTier(*engine.engine, absl::Now() + kWait));
  redis_->Kill();
  // Down: every request is served, computed, and equal to a cold run.
  for (uint32_t seed : {5u, 6u}) {
    const EngineRequest r = Request(seed);
    const RequestResult out = RunOne(*engine.engine, r);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.samples[0], Cold(r).samples[0]);
  }
  const EngineStats down = engine.engine->Stats();
  EXPECT_FALSE(down.remote.up);
  EXPECT_GT(down.remote.connect_errors + down.remote.match_errors + down.remote.store_errors +
                down.remote.stores_dropped,
            0u);

  ASSERT_TRUE(redis_->Restart().ok());      // empty
  absl::SleepFor(absl::Milliseconds(100));  // past the backoff
  const EngineRequest c = Request(7);
  ASSERT_TRUE(RunOne(*engine.engine, c).status.ok());
  ASSERT_TRUE(EngineTestPeer::FlushRemoteTier(*engine.engine, absl::Now() + kWait));
  // The publisher reconnected: another engine finds c's prefix.
  CpuEngine other(WithRemote(redis_->url()));
  const RequestResult warm = RunOne(*other.engine, c);
  ASSERT_TRUE(warm.status.ok()) << warm.status;
  EXPECT_EQ(warm.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(warm.samples[0], Cold(c).samples[0]);
}

// A request whose blocks are being fetched is parked, off the engine thread, while another
// request keeps decoding; then it is admitted with the fetched blocks.
TEST_F(EngineRemoteTierTest, ARequestWaitingForItsBlocksIsParkedWhileOthersDecode) {
  const EngineRequest a = Request(12);
  ASSERT_TRUE(RunAndPublish(redis_->url(), a).status.ok());
  absl::Notification release;
  std::atomic<int> gets{0};
  CpuEngineOptions o = WithRemote(redis_->url());
  o.remote_tier.fetch_timeout = kMaxRemoteTierTimeout;  // the hook holds the fetch a while
  o.remote_tier.cap_wait_at_compute = false;            // ... longer than computing its blocks
  o.remote_tier.fetch_hook = [&] {
    ++gets;
    release.WaitForNotification();
  };
  CpuEngine engine(o);
  EngineRequest decoding = Request(13);
  decoding.max_new_tokens = 150;
  absl::StatusOr<std::shared_ptr<RequestStream>> d = engine.engine->Submit(decoding);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<std::shared_ptr<RequestStream>> w = engine.engine->Submit(a);
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::Time deadline = absl::Now() + kWait;
  while (gets.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(gets.load(), 1) << "the fetch started";
  // The fetch is stuck; the other request decodes on.
  ExpectOthersDecodeWhileParked(*engine.engine, **w, deadline);
  release.Notify();
  const RequestResult warm = Collect(**w);
  ASSERT_TRUE(warm.status.ok()) << warm.status;
  EXPECT_EQ(warm.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(warm.samples[0], Cold(a).samples[0]);
  const RequestResult other = Collect(**d);
  ASSERT_TRUE(other.status.ok()) << other.status;
  EXPECT_EQ(other.samples[0], Cold(decoding).samples[0]);
}

// The remote tier's match is answered off the engine thread: while Redis hangs (its timeout
// far away), a new request waits, parked, and the request already running decodes on; when
// Redis answers again, the new one is admitted with its blocks from Redis.
TEST_F(EngineRemoteTierTest, AHungRedisNeverStallsTheEngine) {
  const EngineRequest a = Request(14);
  ASSERT_TRUE(RunAndPublish(redis_->url(), a).status.ok());
  CpuEngineOptions o = WithRemote(redis_->url());
  o.remote_tier.timeout = kMaxRemoteTierTimeout;
  CpuEngine engine(o);
  EngineRequest decoding = Request(15);
  decoding.max_new_tokens = 150;
  absl::StatusOr<std::shared_ptr<RequestStream>> d = engine.engine->Submit(decoding);
  ASSERT_TRUE(d.ok()) << d.status();
  const absl::Time deadline = absl::Now() + kWait;
  while (engine.engine->Stats().scheduler.generated_tokens == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  redis_->Pause();
  absl::StatusOr<std::shared_ptr<RequestStream>> w = engine.engine->Submit(a);
  ASSERT_TRUE(w.ok()) << w.status();
  while (engine.engine->Stats().scheduler.waiting_requests == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ExpectOthersDecodeWhileParked(*engine.engine, **w, deadline);
  redis_->Resume();
  const RequestResult warm = Collect(**w);
  ASSERT_TRUE(warm.status.ok()) << warm.status;
  EXPECT_EQ(warm.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(warm.samples[0], Cold(a).samples[0]);
  EXPECT_EQ(engine.engine->Stats().remote.match_errors, 0u);
  const RequestResult other = Collect(**d);
  ASSERT_TRUE(other.status.ok()) << other.status;
  EXPECT_EQ(other.samples[0], Cold(decoding).samples[0]);
}

// A slow Redis costs a request at most the fetch's deadline (by default twice the command
// timeout: 400 ms here), not the time its blocks take to arrive: with replies trickling in
// (6 KiB each 100 ms, each piece well within the timeout; the 6 blocks' ~100 KB take about
// 1.7 s), the request is admitted by the deadline with the blocks that arrived and verified,
// computes the rest, and its output equals a cold run's.
TEST_F(EngineRemoteTierTest, ASlowRedisCostsARequestAtMostTheFetchDeadline) {
  const EngineRequest a = Request(16);
  ASSERT_TRUE(RunAndPublish(redis_->url(), a).status.ok());
  DelayProxy proxy(redis_->port(), {.chunk_bytes = 6 << 10, .gap = absl::Milliseconds(100)});
  CpuEngineOptions o = WithRemote(proxy.url());
  o.remote_tier.timeout = absl::Milliseconds(200);
  o.remote_tier.cap_wait_at_compute = false;  // the fetch deadline alone, here
  CpuEngine engine(o);
  const absl::Time t0 = absl::Now();
  const RequestResult out = RunOne(*engine.engine, a);
  const absl::Duration took = absl::Now() - t0;
  ASSERT_TRUE(out.status.ok()) << out.status;
  // The match (one small reply) and the fetch's 400 ms, then 100 prompt tokens and 12
  // generated on the tiny model, with a margin for a loaded machine.
  EXPECT_LT(took, absl::Milliseconds(1100)) << "the request waited for every block";
  EXPECT_LT(out.usage.cached_prompt_tokens, 96u);
  const EngineStats s = engine.engine->Stats();
  EXPECT_EQ(s.remote.loads * 16, out.usage.cached_prompt_tokens);
  EXPECT_EQ(s.remote.corrupt_blocks, 0u);
  EXPECT_EQ(out.samples[0], Cold(a).samples[0]);
}

// Prompt scores and tokens of `got` equal those of the same request run cold.
void ExpectEqualsCold(const EngineRequest& r, const RequestResult& got) {
  CpuEngine cold({.pool_blocks = 64, .prefix_cache = false});
  const RequestResult want = RunOne(*cold.engine, r);
  ASSERT_TRUE(want.status.ok() && got.status.ok()) << want.status << got.status;
  ASSERT_EQ(got.prompt.size(), want.prompt.size());
  for (size_t p = 0; p < want.prompt.size(); ++p) {
    ASSERT_EQ(got.prompt[p], want.prompt[p]) << "position " << p;
  }
  ASSERT_EQ(got.samples.size(), want.samples.size());
  for (size_t s = 0; s < want.samples.size(); ++s) EXPECT_EQ(got.samples[s], want.samples[s]);
}

// Score records travel with their blocks through Redis, as through the disk tier: values a
// plain request published carry no scores, so another replica's scoring request computes
// its prompt (and publishes the blocks again, with scores); a third replica's scoring
// request then takes them (positions 1..95 from the records, 96 from the recomputed last
// row), equal to a cold run, and a plain request takes the scored values too.
TEST_F(EngineRemoteTierTest, ScoredValuesServeScoringRequestsOnOtherReplicas) {
  const EngineRequest plain = Request(20);
  EngineRequest scoring = plain;
  scoring.prompt_logprobs = 5;
  ASSERT_TRUE(RunAndPublish(redis_->url(), plain).status.ok());
  {
    CpuEngine second(WithRemote(redis_->url()));
    const RequestResult got = RunOne(*second.engine, scoring);
    ExpectEqualsCold(scoring, got);
    EXPECT_EQ(got.usage.cached_prompt_tokens, 0u);
    EXPECT_EQ(second.engine->Stats().remote.loads, 0u);
    ASSERT_TRUE(EngineTestPeer::FlushRemoteTier(*second.engine, absl::Now() + kWait));
  }
  CpuEngine third(WithRemote(redis_->url()));
  const RequestResult got = RunOne(*third.engine, scoring);
  ExpectEqualsCold(scoring, got);
  EXPECT_EQ(got.usage.cached_prompt_tokens, 95u);
  EngineStats s = third.engine->Stats();
  EXPECT_EQ(s.scheduler.prompt_logprob_tokens_cached, 95u);
  EXPECT_EQ(s.scheduler.remote_hit_tokens, 95u);
  EXPECT_EQ(s.remote.loads, 6u);
  EXPECT_EQ(s.remote.corrupt_blocks, 0u);
  CpuEngine fourth(WithRemote(redis_->url()));
  const RequestResult again = RunOne(*fourth.engine, plain);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(again.samples[0], Cold(plain).samples[0]);
}

class FullRedisEngineTest : public EngineRemoteTierTest {
 protected:
  FullRedisEngineTest() { extra_ = {"--maxmemory-policy", "noeviction"}; }
};

TEST_F(FullRedisEngineTest, AFullRedisCostsStoresNotRequests) {
  const std::string info = redis_->Command({"INFO", "memory"});
  const int64_t used = std::stoll(info.substr(info.find("used_memory:") + 12));
  // Room for two or three of the tiny model's blocks.
  ASSERT_EQ(redis_->Command({"CONFIG", "SET", "maxmemory", std::to_string(used + (160 << 10))}),
            "OK");
  CpuEngine engine(WithRemote(redis_->url()));
  for (uint32_t seed : {8u, 9u}) {
    const EngineRequest r = Request(seed);
    const RequestResult out = RunOne(*engine.engine, r);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.samples[0], Cold(r).samples[0]);
    EngineTestPeer::FlushRemoteTier(*engine.engine, absl::Now() + kWait);
  }
  const EngineStats s = engine.engine->Stats();
  EXPECT_GT(s.remote.store_errors, 0u);
  EXPECT_LT(s.remote.stores, 12u);
}

}  // namespace
}  // namespace prefixd
