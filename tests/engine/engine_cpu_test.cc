// The engine on the real CPU backend and a tiny random GPT-2: concurrency, preemption and
// the prefix cache are invisible in the output, compared with == against cold runs alone.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "tests/engine/engine_test_peer.h"
#include "gtest/gtest.h"
#include "tests/engine/cpu_engine_fixture.h"
#include "tests/engine/engine_test_util.h"

namespace prefixd {
namespace {

std::vector<uint32_t> RandomTokens(std::mt19937* rng, int n) {
  std::uniform_int_distribution<uint32_t> tok(0, 50255);
  std::vector<uint32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(tok(*rng));
  return out;
}

enum class Mix { kGreedy, kSeeded, kForks, kPenalties };

// The sampling controls, varied by request: each on its own, and all together.
void AddPenalties(int i, std::mt19937* rng, SamplingParams* s) {
  if (i % 5 == 0) s->temperature = 0.0f;  // greedy with penalties
  switch (i % 4) {
    case 0:
      s->frequency_penalty = 1.5f;
      break;
    case 1:
      s->presence_penalty = -0.8f;
      s->min_p = 0.05f;
      break;
    case 2:
      s->repetition_penalty = 1.3f;
      break;
    default:
      s->frequency_penalty = 0.7f;
      s->presence_penalty = 0.6f;
      s->repetition_penalty = 0.9f;
      s->min_p = 0.02f;
      break;
  }
  for (int b = 0; b < i % 7; ++b) {
    s->logit_bias.push_back({static_cast<uint32_t>((*rng)() % 50257),
                             static_cast<float>(static_cast<int>((*rng)() % 201) - 100)});
  }
  std::sort(s->logit_bias.begin(), s->logit_bias.end(),
            [](const TokenBias& a, const TokenBias& b) { return a.token_id < b.token_id; });
  s->logit_bias.erase(std::unique(s->logit_bias.begin(), s->logit_bias.end(),
                                  [](const TokenBias& a, const TokenBias& b) {
                                    return a.token_id == b.token_id;
                                  }),
                      s->logit_bias.end());
}

std::vector<EngineRequest> MixedRequests(Mix mix, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<uint32_t> system = RandomTokens(&rng, 32);
  std::vector<EngineRequest> out;
  for (int i = 0; i < 32; ++i) {
    EngineRequest r;
    r.request_id = absl::StrCat("r", i);
    if (i % 2 == 0) r.prompt = system;  // half share a prefix (cache hits mid-batch)
    const std::vector<uint32_t> own = RandomTokens(&rng, 1 + static_cast<int>(rng() % 24));
    r.prompt.insert(r.prompt.end(), own.begin(), own.end());
    r.max_new_tokens = 4 + rng() % 24;  // grows by up to 4 blocks of 8 after admission
    r.ignore_eos = true;
    r.top_logprobs = i % 3;
    if (mix != Mix::kGreedy) {
      r.sampling = {.temperature = 0.9f,
                    .top_k = i % 4 == 0 ? 0u : 40u,
                    .top_p = i % 3 == 0 ? 0.9f : 1.0f,
                    .seed = 1000u + i};
    }
    if (mix == Mix::kForks || mix == Mix::kPenalties) r.num_samples = 1 + i % 4;
    if (mix == Mix::kPenalties) AddPenalties(i, &rng, &r.sampling);
    out.push_back(r);
  }
  return out;
}

void ExpectConcurrencyIsInvisible(Mix mix) {
  const std::vector<EngineRequest> requests = MixedRequests(mix, 7 + static_cast<int>(mix));
  // Each request alone on an idle engine (no prefix cache: nothing left by another).
  std::vector<RequestResult> alone;
  {
    CpuEngine ref({.pool_blocks = 64, .prefix_cache = false});
    for (const EngineRequest& r : requests) alone.push_back(RunOne(*ref.engine, r));
  }
  // All together on a pool of 96 tokens for 32 x up to 83 tokens: preemption is forced.
  CpuEngine busy({.pool_blocks = 12, .block_size = 8, .max_batch_tokens = 64});
  const std::vector<std::shared_ptr<RequestStream>> streams =
      SubmitTogether(*busy.engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ASSERT_NE(streams[i], nullptr);
    const RequestResult together = Collect(*streams[i]);
    ASSERT_TRUE(alone[i].status.ok()) << alone[i].status;
    ASSERT_TRUE(together.status.ok()) << together.status;
    ASSERT_EQ(together.samples.size(), requests[i].num_samples);
    for (size_t s = 0; s < together.samples.size(); ++s) {
      EXPECT_EQ(together.samples[s].ids.size(), requests[i].max_new_tokens);
      EXPECT_EQ(together.samples[s], alone[i].samples[s]) << "sample " << s;
    }
    EXPECT_EQ(together.usage.completion_tokens, alone[i].usage.completion_tokens);
  }
  const EngineStats stats = busy.engine->Stats();
  EXPECT_GT(stats.scheduler.preemptions, 0u);
  std::printf("preemptions: %llu, cached prompt tokens: %llu\n",
              static_cast<unsigned long long>(stats.scheduler.preemptions),
              static_cast<unsigned long long>(stats.cache.hit_tokens));
  EXPECT_GT(stats.cache.hit_tokens, 0u);
  EngineTestPeer::RunWithKvCache(*busy.engine, [](const KvCache& cache) {
    cache.CheckInvariants();
    EXPECT_EQ(cache.Stats().blocks_active, 0);
  });
}

TEST(EngineCpuTest, ConcurrencyIsInvisibleGreedy) { ExpectConcurrencyIsInvisible(Mix::kGreedy); }
TEST(EngineCpuTest, ConcurrencyIsInvisibleSeeded) { ExpectConcurrencyIsInvisible(Mix::kSeeded); }
TEST(EngineCpuTest, ConcurrencyIsInvisibleForks) { ExpectConcurrencyIsInvisible(Mix::kForks); }
TEST(EngineCpuTest, ConcurrencyIsInvisibleWithPenaltiesBiasAndMinP) {
  ExpectConcurrencyIsInvisible(Mix::kPenalties);
}

// A request with every sampling control, cached and cold: the same tokens, and the
// penalties visibly act (the output differs from the same request without them).
TEST(EngineCpuTest, PenaltiesGiveTheSameTokensCachedAndCold) {
  std::mt19937 rng(5);
  EngineRequest base;
  base.prompt = RandomTokens(&rng, 100);
  base.max_new_tokens = 40;
  base.ignore_eos = true;
  base.num_samples = 3;
  base.top_logprobs = 2;
  base.sampling = {.temperature = 0.8f, .top_k = 50, .seed = 77};
  EngineRequest penalised = base;
  AddPenalties(3, &rng, &penalised.sampling);
  EngineRequest greedy = base;
  greedy.sampling = {.temperature = 0.0f, .frequency_penalty = 1.0f, .repetition_penalty = 1.5f};
  greedy.num_samples = 1;

  CpuEngine warm({.pool_blocks = 64, .block_size = 16});
  CpuEngine cold({.pool_blocks = 64, .block_size = 16, .prefix_cache = false});
  for (const EngineRequest* r : {&penalised, &greedy}) {
    EngineRequest plain = *r;
    plain.sampling.presence_penalty = plain.sampling.frequency_penalty = 0.0f;
    plain.sampling.repetition_penalty = 1.0f;
    plain.sampling.min_p = 0.0f;
    plain.sampling.logit_bias.clear();
    const RequestResult filler = RunOne(*warm.engine, plain);  // leaves the prompt cached
    const RequestResult hit = RunOne(*warm.engine, *r);
    const RequestResult miss = RunOne(*cold.engine, *r);
    ASSERT_TRUE(hit.status.ok() && miss.status.ok() && filler.status.ok());
    EXPECT_EQ(hit.usage.cached_prompt_tokens, 99u);
    EXPECT_EQ(miss.usage.cached_prompt_tokens, 0u);
    ASSERT_EQ(hit.samples.size(), r->num_samples);
    for (size_t s = 0; s < hit.samples.size(); ++s) {
      EXPECT_EQ(hit.samples[s], miss.samples[s]) << "sample " << s;
      EXPECT_NE(hit.samples[s].ids, filler.samples[s].ids) << "sample " << s;
    }
  }
}

TEST(EngineCpuTest, PrefixCacheServesPartialBlocksAndStaysInItsNamespace) {
  std::mt19937 rng(42);
  EngineRequest base;
  base.prompt = RandomTokens(&rng, 200);
  base.max_new_tokens = 40;
  base.ignore_eos = true;
  base.top_logprobs = 2;
  base.cache_namespace = "tenant-a";

  CpuEngine warm({.pool_blocks = 64, .block_size = 16});
  const RequestResult first = RunOne(*warm.engine, base);
  ASSERT_TRUE(first.status.ok());
  ASSERT_EQ(first.samples[0].ids.size(), 40u);
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0u);

  // 200 tokens + a 10-token suffix that leaves the first request's continuation at once.
  EngineRequest suffixed = base;
  suffixed.max_new_tokens = 30;
  std::vector<uint32_t> suffix = RandomTokens(&rng, 10);
  if (suffix[0] == first.samples[0].ids[0]) suffix[0] = (suffix[0] + 1) % 50256;
  suffixed.prompt.insert(suffixed.prompt.end(), suffix.begin(), suffix.end());
  EngineRequest same = base;
  same.max_new_tokens = 30;

  const uint64_t copies_before = warm.engine->Stats().cache.cow_copies;
  const RequestResult warm_suffixed = RunOne(*warm.engine, suffixed);
  // 12 whole shared blocks (192 tokens) + 8 rows of the 13th copied on write.
  EXPECT_EQ(warm_suffixed.usage.cached_prompt_tokens, 200u);
  EXPECT_EQ(warm.engine->Stats().cache.cow_copies, copies_before + 1);
  const RequestResult warm_same = RunOne(*warm.engine, same);
  EXPECT_EQ(warm_same.usage.cached_prompt_tokens, 199u);  // the last token is recomputed

  EngineRequest other_suffixed = suffixed, other_same = same;
  // Two other namespaces: run in one, the second would hit the first's blocks.
  other_suffixed.cache_namespace = "tenant-b";
  other_same.cache_namespace = "tenant-c";
  EXPECT_EQ(RunOne(*warm.engine, other_suffixed).usage.cached_prompt_tokens, 0u);
  EXPECT_EQ(RunOne(*warm.engine, other_same).usage.cached_prompt_tokens, 0u);

  CpuEngine cold({.pool_blocks = 64, .block_size = 16, .prefix_cache = false});
  const RequestResult cold_suffixed = RunOne(*cold.engine, suffixed);
  const RequestResult cold_same = RunOne(*cold.engine, same);
  EXPECT_EQ(cold_suffixed.usage.cached_prompt_tokens, 0u);
  ASSERT_EQ(warm_suffixed.samples.size(), 1u);
  EXPECT_EQ(warm_suffixed.samples[0], cold_suffixed.samples[0]);
  EXPECT_EQ(warm_same.samples[0], cold_same.samples[0]);
  // The identical prompt continues exactly like the first run did.
  EXPECT_EQ(std::vector<uint32_t>(first.samples[0].ids.begin(), first.samples[0].ids.begin() + 30),
            warm_same.samples[0].ids);
}

}  // namespace
}  // namespace prefixd
