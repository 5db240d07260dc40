// Tenants through the engine (issue-level rules in docs/SERVER.md, "Tenants"): cache shares
// keep a flood's evictions to the flooder, retention survives pressure and lapses with the
// clock, and outputs equal solo runs. A FakeBackend (tests/engine/fake_backend.h) makes the
// outputs a pure function of the tokens.
#include <atomic>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cache/block_key.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_peer.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/fake_backend.h"

namespace prefixd {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kBlockSize = 4;

ModelConfig FakeConfig() { return FakeModelConfig(kVocab); }

struct Harness {
  // `blocks` of 4 tokens; the clock reads `now`, which tests move.
  Harness(int64_t blocks, double share, std::vector<TenantPolicy> tenants = {},
          int32_t max_waiting = 0)
      : backend(blocks, kBlockSize, kVocab) {
    EngineOptions o;
    o.tenant_max_waiting = max_waiting;
    o.backend = &backend;
    o.model_config = FakeConfig();
    o.manifest_sha256 = "fake-manifest";
    o.max_batch_tokens = 64;
    o.tenant_cache_share = share;
    o.tenants = std::move(tenants);
    o.clock = [this] { return absl::FromUnixMillis(now_ms.load()); };
    auto e = Engine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    engine = *std::move(e);
  }
  ~Harness() { engine->Shutdown(absl::ZeroDuration()); }

  FakeBackend backend;
  std::atomic<int64_t> now_ms{1'000'000};
  std::unique_ptr<Engine> engine;
};

EngineRequest Request(const std::string& tenant, std::vector<uint32_t> prompt) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = 2;
  r.ignore_eos = true;
  r.tenant = tenant;
  r.cache_namespace = CacheNamespace(tenant, "");
  return r;
}

std::vector<uint32_t> Tokens(uint32_t first, int n) {
  std::vector<uint32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((first + static_cast<uint32_t>(i)) % (kVocab - 1));
  return t;
}

// The quiet tenant's 9-token prompt (two full blocks) after a flood of 12 unique noisy
// prompts in a 16-block pool: with shares the flood evicts only noisy blocks and the quiet
// prompt hits; without, plain LRU evicts it. Outputs equal a solo engine's either way.
TEST(EngineTenantTest, AFloodEvictsOnlyTheFloodersBlocks) {
  for (const double share : {1.0, 0.25}) {
    SCOPED_TRACE(share);
    Harness h(16, share);
    const EngineRequest quiet = Request("quiet", Tokens(1, 9));
    ASSERT_TRUE(RunOne(*h.engine, quiet).status.ok());
    for (uint32_t i = 0; i < 12; ++i) {
      const RequestResult r = RunOne(*h.engine, Request("noisy", Tokens(10 + 5 * i, 9)));
      ASSERT_TRUE(r.status.ok()) << r.status;
    }
    const RequestResult again = RunOne(*h.engine, quiet);
    ASSERT_TRUE(again.status.ok());
    EXPECT_EQ(again.usage.cached_prompt_tokens, share < 1.0 ? 8u : 0u);
    Harness solo(16, 1.0);
    const RequestResult alone = RunOne(*solo.engine, quiet);
    EXPECT_EQ(again.samples, alone.samples);
    // The pool's per-tenant view: the noisy tenant was the one evicted.
    const EngineStats s = h.engine->Stats();
    ASSERT_EQ(s.tenants.size(), 2u);
    EXPECT_EQ(s.tenants[0].first, "quiet");
    EXPECT_EQ(s.tenants[1].first, "noisy");
    EXPECT_EQ(s.tenants[0].second.evictions, share < 1.0 ? 0u : 2u);
    EXPECT_GT(s.tenants[1].second.evictions, 0u);
  }
}

// A per-tenant share in the policy overrides the default.
TEST(EngineTenantTest, APolicyShareOverridesTheDefault) {
  Harness h(16, 1.0, {TenantPolicy{.name = "noisy", .cache_share = 0.25}});
  const EngineRequest quiet = Request("quiet", Tokens(1, 9));
  ASSERT_TRUE(RunOne(*h.engine, quiet).status.ok());
  for (uint32_t i = 0; i < 12; ++i) RunOne(*h.engine, Request("noisy", Tokens(10 + 5 * i, 9)));
  EXPECT_EQ(RunOne(*h.engine, quiet).usage.cached_prompt_tokens, 8u);
}

// Retention (prompt_cache_retention "24h") keeps the prompt through a flood with no shares
// at all, reports the tokens it served as retained, renews with use, and lapses 24 hours
// after the last use.
TEST(EngineTenantTest, RetentionSurvivesPressureAndLapses) {
  Harness h(16, 1.0);
  EngineRequest quiet = Request("quiet", Tokens(1, 9));
  quiet.cache_retention = absl::Hours(24);
  ASSERT_TRUE(RunOne(*h.engine, quiet).status.ok());
  auto flood = [&](uint32_t base) {
    for (uint32_t i = 0; i < 12; ++i) {
      ASSERT_TRUE(RunOne(*h.engine, Request("noisy", Tokens(base + 5 * i, 9))).status.ok());
    }
  };
  flood(10);
  h.now_ms += absl::ToInt64Milliseconds(absl::Hours(20));
  const RequestResult hit = RunOne(*h.engine, Request("quiet", Tokens(1, 9)));  // a use
  EXPECT_EQ(hit.usage.cached_prompt_tokens, 8u);
  EXPECT_EQ(hit.usage.cached_retained_tokens, 8u);
  // 20 h after that use (40 h after the first): renewed, still retained.
  h.now_ms += absl::ToInt64Milliseconds(absl::Hours(20));
  flood(20);
  EXPECT_EQ(RunOne(*h.engine, Request("quiet", Tokens(1, 9))).usage.cached_retained_tokens, 8u);
  // 25 h without a use: lapsed, a normal block the next flood evicts.
  h.now_ms += absl::ToInt64Milliseconds(absl::Hours(25));
  flood(30);
  const RequestResult after = RunOne(*h.engine, Request("quiet", Tokens(1, 9)));
  EXPECT_EQ(after.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(after.usage.cached_retained_tokens, 0u);
}

// --max-cache-retention 0 turns retention off: the flood evicts the prompt.
TEST(EngineTenantTest, MaxCacheRetentionZeroTurnsRetentionOff) {
  FakeBackend backend(16, kBlockSize, kVocab);
  EngineOptions o;
  o.backend = &backend;
  o.model_config = FakeConfig();
  o.manifest_sha256 = "fake-manifest";
  o.max_cache_retention = absl::ZeroDuration();
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EngineRequest quiet = Request("quiet", Tokens(1, 9));
  quiet.cache_retention = absl::Hours(24);
  ASSERT_TRUE(RunOne(**e, quiet).status.ok());
  for (uint32_t i = 0; i < 12; ++i) RunOne(**e, Request("noisy", Tokens(10 + 5 * i, 9)));
  EXPECT_EQ(RunOne(**e, Request("quiet", Tokens(1, 9))).usage.cached_prompt_tokens, 0u);
  (*e)->Shutdown(absl::ZeroDuration());
}

// Holds the engine thread between two steps while `fn` runs on this thread, so that what
// `fn` submits stays waiting.
void WhileHeld(Engine& engine, const std::function<void()>& fn) {
  absl::Notification held, release;
  std::thread holder([&] {
    EngineTestPeer::RunWithKvCache(engine, [&](const KvCache&) {
      held.Notify();
      release.WaitForNotification();
    });
  });
  held.WaitForNotification();
  fn();
  release.Notify();
  holder.join();
}

TenantPolicy WaitingCap(const std::string& name, int32_t cap) {
  TenantPolicy p;
  p.name = name;
  p.max_waiting = cap;
  return p;
}

// The waiting cap: `noisy`'s own (2) and the default (1) for the others; a request past it
// is refused with RESOURCE_EXHAUSTED naming the tenant, others' requests are not, and once
// the queue drains the tenant is accepted again. A reload moves the cap at once.
TEST(EngineTenantTest, TheWaitingCapRefusesPastItAndAcceptsOnceDrained) {
  Harness h(64, 1.0, {WaitingCap("noisy", 2)}, /*max_waiting=*/1);
  std::vector<std::shared_ptr<RequestStream>> accepted;
  WhileHeld(*h.engine, [&] {
    for (uint32_t i = 0; i < 2; ++i) {
      auto s = h.engine->Submit(Request("noisy", Tokens(1 + 5 * i, 9)));
      ASSERT_TRUE(s.ok()) << s.status();
      accepted.push_back(*s);
    }
    const auto refused = h.engine->Submit(Request("noisy", Tokens(20, 9)));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(refused.status().message(),
              "tenant `noisy` has 2 requests waiting, its cap (--tenant-max-waiting or "
              "max_waiting= in --auth-tokens): retry later");
    auto quiet = h.engine->Submit(Request("quiet", Tokens(30, 9)));
    ASSERT_TRUE(quiet.ok()) << quiet.status();
    accepted.push_back(*quiet);
    EXPECT_EQ(h.engine->Submit(Request("quiet", Tokens(40, 9))).status().message(),
              "tenant `quiet` has 1 requests waiting, its cap (--tenant-max-waiting or "
              "max_waiting= in --auth-tokens): retry later");
  });
  for (auto& s : accepted) EXPECT_TRUE(Collect(*s).status.ok());
  // Drained: accepted again, up to the cap.
  WhileHeld(*h.engine, [&] {
    accepted.clear();
    for (uint32_t i = 0; i < 2; ++i) {
      auto s = h.engine->Submit(Request("noisy", Tokens(1 + 5 * i, 9)));
      ASSERT_TRUE(s.ok()) << s.status();
      accepted.push_back(*s);
    }
    EXPECT_EQ(h.engine->Submit(Request("noisy", Tokens(20, 9))).status().code(),
              absl::StatusCode::kResourceExhausted);
  });
  for (auto& s : accepted) EXPECT_TRUE(Collect(*s).status.ok());
  // A reload: noisy takes the default (1), quiet no cap (0).
  ASSERT_TRUE(h.engine->SetTenantPolicies({WaitingCap("quiet", 0)}).ok());
  WhileHeld(*h.engine, [&] {
    accepted.clear();
    auto s = h.engine->Submit(Request("noisy", Tokens(1, 9)));
    ASSERT_TRUE(s.ok()) << s.status();
    accepted.push_back(*s);
    EXPECT_EQ(h.engine->Submit(Request("noisy", Tokens(6, 9))).status().code(),
              absl::StatusCode::kResourceExhausted);
    for (uint32_t i = 0; i < 3; ++i) {
      auto q = h.engine->Submit(Request("quiet", Tokens(30 + 5 * i, 9)));
      ASSERT_TRUE(q.ok()) << q.status();
      accepted.push_back(*q);
    }
  });
  for (auto& s : accepted) EXPECT_TRUE(Collect(*s).status.ok());
}

// Two tenants with different weights through the engine, all queued at once in a small
// batch budget: every output equals a solo engine's.
TEST(EngineTenantTest, WeightedTenantsOutputsEqualSoloRuns) {
  TenantPolicy heavy;
  heavy.name = "heavy";
  heavy.weight = 3;
  FakeBackend backend(64, kBlockSize, kVocab);
  EngineOptions o;
  o.backend = &backend;
  o.model_config = FakeConfig();
  o.manifest_sha256 = "fake-manifest";
  o.max_batch_tokens = 6;
  o.tenants = {heavy};
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<EngineRequest> requests;
  for (uint32_t i = 0; i < 6; ++i) {
    requests.push_back(Request(i % 3 == 0 ? "light" : "heavy", Tokens(1 + 7 * i, 9 + i)));
  }
  const std::vector<std::shared_ptr<RequestStream>> streams = SubmitTogether(**e, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(i);
    const RequestResult together = Collect(*streams[i]);
    ASSERT_TRUE(together.status.ok()) << together.status;
    Harness solo(64, 1.0);
    EXPECT_EQ(together.samples, RunOne(*solo.engine, requests[i]).samples);
  }
  (*e)->Shutdown(absl::ZeroDuration());
}

TEST(EngineTenantTest, TenantOptionsOutOfRangeAreRefused) {
  FakeBackend backend(16, kBlockSize, kVocab);
  EngineOptions o;
  o.backend = &backend;
  o.model_config = FakeConfig();
  o.manifest_sha256 = "fake-manifest";
  o.tenant_cache_share = 0;
  EXPECT_EQ(Engine::Create(o).status().message(),
            "--tenant-cache-share must be a fraction of the pool in (0, 1], got 0");
  o.tenant_cache_share = 1;
  o.tenants = {TenantPolicy{.name = "x", .weight = 0}};
  EXPECT_EQ(Engine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace prefixd
