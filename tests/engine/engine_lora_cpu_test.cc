// LoRA adapters through the engine on the CPU backend and a tiny random GPT-2: the cache
// keeps every adapter's blocks apart from the base's and from every other adapter's (the 2%
// hazard: an adapter differing from another by 2% in one layer's B gets no hit from it),
// including on the disk tier, and a mixed batch of the base and three adapters gives each
// request what it gets alone (==).
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/lora_adapter.h"
#include "gtest/gtest.h"
#include "tests/cache/tier_test_util.h"
#include "tests/engine/cpu_engine_fixture.h"
#include "tests/engine/engine_test_peer.h"
#include "tests/engine/engine_test_util.h"
#include "tools/random_adapter.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;

std::vector<uint32_t> RandomTokens(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> tok(0, 50255);
  std::vector<uint32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(tok(rng));
  return out;
}

// 100 prompt tokens: 6 whole blocks of 16 can be shared.
EngineRequest Request(uint32_t seed, std::shared_ptr<const LoraAdapter> adapter) {
  EngineRequest r;
  r.prompt = RandomTokens(seed, 100);
  r.max_new_tokens = 12;
  r.ignore_eos = true;
  r.top_logprobs = 2;
  r.cache_namespace = "tenant-a";
  r.adapter = std::move(adapter);
  return r;
}

RandomAdapterOptions Options(uint64_t seed, int32_t rank = 4) {
  RandomAdapterOptions o;
  o.rank = rank;
  o.lora_alpha = 2.0f * rank;
  o.seed = seed;
  o.b_std = 0.1f;
  return o;
}

// Writes `tensors` as an adapter under a fresh directory and loads it for the tiny model.
std::shared_ptr<const LoraAdapter> Load(const std::string& dir, const RandomAdapterOptions& o,
                                        const std::vector<AdapterTensor>& tensors) {
  const absl::Status written = WriteAdapterFiles(dir, AdapterConfigJson(o), tensors);
  EXPECT_TRUE(written.ok()) << written;
  auto a = LoadLoraAdapter(dir, TinyModel::Get().config());
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *a : nullptr;
}

class EngineLoraCpuTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = std::make_unique<testing::ScratchDir>("engine_lora"); }
  std::string Dir(const std::string& name) { return dir_->path() + "/" + name; }

  RequestResult Cold(const EngineRequest& r) {
    CpuEngine cold({.pool_blocks = 64, .prefix_cache = false});
    return RunOne(*cold.engine, r);
  }

  std::unique_ptr<testing::ScratchDir> dir_;
};

TEST_F(EngineLoraCpuTest, AnAdapterTwoPercentApartGetsNoHitFromTheOther) {
  const ModelConfig& c = TinyModel::Get().config();
  const RandomAdapterOptions o = Options(1);
  std::vector<AdapterTensor> tensors = RandomAdapterTensors(c, o);
  const auto a = Load(Dir("a"), o, tensors);
  // The same adapter with layer 1's mlp.c_proj B scaled by 1.02.
  for (AdapterTensor& t : tensors) {
    if (t.name == "base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight") {
      for (float& v : t.values) v *= 1.02f;
    }
  }
  const auto a2 = Load(Dir("a2"), o, tensors);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(a2, nullptr);
  ASSERT_NE(a->digest, a2->digest);

  CpuEngine warm({.pool_blocks = 64, .block_size = 16});
  const RequestResult first = RunOne(*warm.engine, Request(7, a));
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0u);
  // The same adapter hits its own blocks...
  const RequestResult again = RunOne(*warm.engine, Request(7, a));
  EXPECT_EQ(again.usage.cached_prompt_tokens, 96u);  // 6 whole blocks
  EXPECT_EQ(again.samples[0], first.samples[0]);
  // ...the one 2% apart does not, and answers as it does cold...
  const RequestResult other = RunOne(*warm.engine, Request(7, a2));
  EXPECT_EQ(other.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(other.samples[0], Cold(Request(7, a2)).samples[0]);
  // ...which is not what the first adapter answers (so a stale hit would have been wrong).
  EXPECT_NE(other.samples[0].logprobs, first.samples[0].logprobs);
  // The base hits neither, nor does either adapter hit the base's blocks.
  const RequestResult base = RunOne(*warm.engine, Request(7, nullptr));
  EXPECT_EQ(base.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(base.samples[0], Cold(Request(7, nullptr)).samples[0]);
  EXPECT_EQ(RunOne(*warm.engine, Request(7, nullptr)).usage.cached_prompt_tokens, 96u);  // 6 whole blocks
  EXPECT_EQ(RunOne(*warm.engine, Request(7, a2)).usage.cached_prompt_tokens, 96u);  // 6 whole blocks
  EngineTestPeer::RunWithKvCache(*warm.engine, [](const KvCache& cache) {
    cache.CheckInvariants();
  });
}

TEST_F(EngineLoraCpuTest, ReloadedFilesUnderOneDirectoryNeverServeTheOldBlocks) {
  const ModelConfig& c = TinyModel::Get().config();
  const auto before = Load(Dir("x"), Options(2), RandomAdapterTensors(c, Options(2)));
  CpuEngine warm({.pool_blocks = 64, .block_size = 16});
  ASSERT_TRUE(RunOne(*warm.engine, Request(8, before)).status.ok());
  // New files in the same directory (the same name to an operator): a new identity.
  const auto after = Load(Dir("x"), Options(3), RandomAdapterTensors(c, Options(3)));
  ASSERT_NE(before->digest, after->digest);
  const RequestResult out = RunOne(*warm.engine, Request(8, after));
  EXPECT_EQ(out.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(out.samples[0], Cold(Request(8, after)).samples[0]);
}

TEST_F(EngineLoraCpuTest, MixedBatchOfBaseAndThreeAdaptersEqualsEachAlone) {
  const ModelConfig& c = TinyModel::Get().config();
  std::vector<std::shared_ptr<const LoraAdapter>> who = {nullptr};
  for (int i = 1; i <= 3; ++i) {
    RandomAdapterOptions o = Options(10 + i, 2 * i);
    if (i == 3) o.target_modules = {"c_attn", "c_fc"};
    who.push_back(Load(Dir(absl::StrCat("m", i)), o, RandomAdapterTensors(c, o)));
  }
  // 16 requests, four per model; half share a prompt start (hits inside each adapter).
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 16; ++i) {
    EngineRequest r = Request(i % 2 == 0 ? 20 : 21 + i, who[i % 4]);
    r.prompt.resize(40 + 3 * i);
    r.max_new_tokens = 6 + i % 5;
    r.request_id = absl::StrCat("r", i);
    requests.push_back(r);
  }
  std::vector<RequestResult> alone;
  for (const EngineRequest& r : requests) alone.push_back(Cold(r));
  // Together on a pool too small for all of them (preemption), with prefill chunks.
  CpuEngine busy({.pool_blocks = 24, .block_size = 8, .max_batch_tokens = 64});
  const auto streams = SubmitTogether(*busy.engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ASSERT_NE(streams[i], nullptr);
    const RequestResult together = Collect(*streams[i]);
    ASSERT_TRUE(together.status.ok()) << together.status;
    ASSERT_EQ(together.samples.size(), 1u);
    EXPECT_EQ(together.samples[0], alone[i].samples[0]);
  }
  // The same request under an adapter answers differently (the equalities above compare
  // different computations, not one).
  EngineRequest adapted = requests[0];
  adapted.adapter = who[2];
  EXPECT_NE(Cold(adapted).samples[0].logprobs, alone[0].samples[0].logprobs);
  EXPECT_GT(busy.engine->Stats().cache.hit_tokens, 0u);
}

// The disk tier is keyed by the same root: after a restart on the same directory, the
// adapter's files serve the adapter and nothing else.
TEST_F(EngineLoraCpuTest, TheDiskTierKeepsAnAdaptersBlocksApart) {
  const ModelConfig& c = TinyModel::Get().config();
  const auto a = Load(Dir("d1"), Options(4), RandomAdapterTensors(c, Options(4)));
  const auto b = Load(Dir("d2"), Options(5), RandomAdapterTensors(c, Options(5)));
  testing::ScratchDir tier("engine_lora_tier");
  auto with_tier = [&] {
    CpuEngineOptions o{.pool_blocks = 16, .block_size = 16};
    o.disk_tier.dir = tier.path();
    o.disk_tier.max_bytes = int64_t{256} << 20;
    return o;
  };
  {
    CpuEngine first(with_tier());
    ASSERT_TRUE(RunOne(*first.engine, Request(9, a)).status.ok());
    first.engine->Shutdown(absl::Seconds(10));
    EXPECT_GT(first.engine->Stats().disk.blocks, 0u);
  }
  CpuEngine second(with_tier());
  const auto named = [](EngineRequest r, const std::string& name) {
    r.adapter_name = name;
    return r;
  };
  const RequestResult base = RunOne(*second.engine, Request(9, nullptr));
  EXPECT_EQ(base.usage.cached_prompt_tokens, 0u);
  const RequestResult other = RunOne(*second.engine, named(Request(9, b), "b"));
  EXPECT_EQ(other.usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(second.engine->Stats().disk.loads, 0u);
  const RequestResult own = RunOne(*second.engine, named(Request(9, a), "a"));
  EXPECT_EQ(own.usage.cached_prompt_tokens, 96u);
  EXPECT_EQ(second.engine->Stats().scheduler.disk_hit_tokens, 96u);
  EXPECT_EQ(own.samples[0], Cold(Request(9, a)).samples[0]);
  // Prompt tokens by adapter name, disk hits included; summed they are the engine's totals,
  // and a drain takes them once.
  const AdapterTokenCounts counts = second.engine->DrainAdapterTokens();
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts.at("").queried_tokens, 100u);
  EXPECT_EQ(counts.at("").hit_tokens, 0u);
  EXPECT_EQ(counts.at("b").queried_tokens, 100u);
  EXPECT_EQ(counts.at("b").hit_tokens, 0u);
  EXPECT_EQ(counts.at("a").queried_tokens, 100u);
  EXPECT_EQ(counts.at("a").hit_tokens, 96u);
  const EngineStats stats = second.engine->Stats();
  EXPECT_EQ(stats.cache.queried_tokens, 300u);
  EXPECT_EQ(HitTokens(stats), 96u);
  EXPECT_TRUE(second.engine->DrainAdapterTokens().empty());
  // A pool hit counts under its name too.
  EXPECT_EQ(RunOne(*second.engine, named(Request(9, a), "a")).usage.cached_prompt_tokens, 96u);
  const AdapterTokenCounts later = second.engine->DrainAdapterTokens();
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later.at("a").queried_tokens, 100u);
  EXPECT_EQ(later.at("a").hit_tokens, 96u);
  EXPECT_EQ(HitTokens(second.engine->Stats()), 192u);
}

}  // namespace
}  // namespace prefixd
