// Prompt logprobs on the real CPU backend and a tiny random GPT-2: every position's score
// equals the model's own forward over that prefix, bit for bit, whether the engine computes
// it cold, takes it from the score records of cached blocks, or runs without a prefix cache;
// only scoring requests compute all-position logits, and the counters say what came from
// records.
#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "tests/engine/engine_test_peer.h"
#include "engine/sampler.h"
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

// The reference: for each position p >= 1, a fresh one-step forward over prompt[0, p) on
// blocks of its own, and the last row's score of prompt[p] (ScoreToken: the same
// log-softmax the sampler reports).
std::vector<PromptToken> ReferenceScores(const std::vector<uint32_t>& prompt, uint32_t top_n) {
  CpuEngine scratch({.pool_blocks = 64, .block_size = 16, .prefix_cache = false});
  Backend& backend = *scratch.backend;
  std::vector<PromptToken> out;
  out.push_back({.token_id = prompt[0]});
  std::vector<int32_t> table;
  for (int32_t b = 0; b < 64; ++b) table.push_back(63 - b);  // non-contiguous on purpose
  for (size_t p = 1; p < prompt.size(); ++p) {
    SequenceStep step;
    step.token_ids = absl::MakeConstSpan(prompt).subspan(0, p);
    step.start_pos = 0;
    step.block_table = absl::MakeConstSpan(table).subspan(0, (p + 15) / 16);
    step.want_logits = true;
    std::vector<float> logits;
    EXPECT_TRUE(backend.Forward({step}, &logits).ok());
    const SampledToken t = ScoreToken(logits, prompt[p], top_n);
    out.push_back({.token_id = prompt[p], .has_logprob = true, .logprob = t.token.logprob,
                   .top = t.top});
  }
  return out;
}

EngineRequest ScoringRequest(const std::vector<uint32_t>& prompt, uint32_t top_n,
                             uint32_t max_new_tokens) {
  EngineRequest r;
  r.prompt = prompt;
  r.prompt_logprobs = top_n;
  r.max_new_tokens = max_new_tokens;
  r.ignore_eos = true;
  r.top_logprobs = 2;
  return r;
}

TEST(EngineScoringCpuTest, EveryPositionEqualsTheModelsOwnForward) {
  std::mt19937 rng(3);
  const std::vector<uint32_t> prompt = RandomTokens(&rng, 45);
  const std::vector<PromptToken> want = ReferenceScores(prompt, 5);
  // Chunks of 7 tokens: rows of one block come from several steps.
  CpuEngine engine({.pool_blocks = 64, .block_size = 16, .max_batch_tokens = 7});
  const RequestResult got = RunOne(*engine.engine, ScoringRequest(prompt, 5, 3));
  ASSERT_TRUE(got.status.ok()) << got.status;
  ASSERT_EQ(got.prompt_events, 1);
  ASSERT_EQ(got.prompt.size(), prompt.size());
  EXPECT_FALSE(got.prompt[0].has_logprob);
  for (size_t p = 0; p < prompt.size(); ++p) {
    EXPECT_EQ(got.prompt[p], want[p]) << "position " << p;
  }
  ASSERT_EQ(got.samples.size(), 1u);
  EXPECT_EQ(got.samples[0].ids.size(), 3u);
  // The generated tokens are those of the same request without prompt logprobs.
  EngineRequest plain = ScoringRequest(prompt, 5, 3);
  plain.prompt_logprobs.reset();
  CpuEngine cold({.pool_blocks = 64, .block_size = 16, .prefix_cache = false});
  const RequestResult unscored = RunOne(*cold.engine, plain);
  EXPECT_EQ(unscored.prompt_events, 0);
  EXPECT_EQ(got.samples[0], unscored.samples[0]);
  const EngineStats stats = engine.engine->Stats();
  EXPECT_EQ(stats.scheduler.prompt_logprob_tokens, 44u);
  EXPECT_EQ(stats.scheduler.prompt_logprob_tokens_cached, 0u);
}

// Multiple choice: one context, four continuations, as an evaluation harness sends them.
// The second and later choices take the context's scores from the records of its cached
// blocks; every answer equals a cold run and a run without a prefix cache.
TEST(EngineScoringCpuTest, CachedScoresEqualColdAndNoPrefixCache) {
  std::mt19937 rng(9);
  const std::vector<uint32_t> context = RandomTokens(&rng, 70);
  std::vector<EngineRequest> choices;
  for (int c = 0; c < 4; ++c) {
    std::vector<uint32_t> prompt = context;
    const std::vector<uint32_t> cont = RandomTokens(&rng, 3 + 4 * c);
    prompt.insert(prompt.end(), cont.begin(), cont.end());
    choices.push_back(ScoringRequest(prompt, static_cast<uint32_t>(c) * 5, c == 3 ? 0 : 1));
    choices.back().num_samples = c == 2 ? 2 : 1;
  }
  CpuEngine warm({.pool_blocks = 64, .block_size = 16, .max_batch_tokens = 32});
  CpuEngine off({.pool_blocks = 64, .block_size = 16, .prefix_cache = false});
  // A plain request first: its blocks carry no records, so they must not be served.
  EngineRequest unscored_first = choices[0];
  unscored_first.prompt_logprobs.reset();
  ASSERT_TRUE(RunOne(*warm.engine, unscored_first).status.ok());
  uint64_t cached_before = 0;
  for (size_t c = 0; c < choices.size(); ++c) {
    SCOPED_TRACE(absl::StrCat("choice ", c));
    const RequestResult hit = RunOne(*warm.engine, choices[c]);
    const RequestResult miss = RunOne(*off.engine, choices[c]);
    ASSERT_TRUE(hit.status.ok() && miss.status.ok());
    EXPECT_EQ(miss.usage.cached_prompt_tokens, 0u);
    const std::vector<PromptToken> want =
        ReferenceScores(choices[c].prompt, *choices[c].prompt_logprobs);
    ASSERT_EQ(hit.prompt.size(), want.size());
    for (size_t p = 0; p < want.size(); ++p) {
      ASSERT_EQ(hit.prompt[p], want[p]) << "position " << p;
      ASSERT_EQ(miss.prompt[p], want[p]) << "position " << p;
    }
    ASSERT_EQ(hit.samples.size(), choices[c].num_samples);
    for (size_t s = 0; s < hit.samples.size(); ++s) EXPECT_EQ(hit.samples[s], miss.samples[s]);
    if (choices[c].max_new_tokens == 0) {
      for (const SampleResult& s : hit.samples) {
        EXPECT_TRUE(s.ids.empty());
        EXPECT_EQ(s.finish, FinishReason::kLength);
      }
    }
    const uint64_t cached = warm.engine->Stats().scheduler.prompt_logprob_tokens_cached;
    if (c == 0) {
      // The unscored run's blocks had no records: everything computed, but the pool's K/V
      // of blocks without records was not reused for scoring either.
      EXPECT_EQ(cached, 0u);
      EXPECT_EQ(hit.usage.cached_prompt_tokens, 0u);
    } else {
      // 4 whole context blocks carry records (64 tokens): positions 1..63 from them, the
      // last row of block 3 recomputed to score position 64.
      EXPECT_EQ(cached - cached_before, 63u);
      EXPECT_EQ(hit.usage.cached_prompt_tokens, 63u);
    }
    cached_before = cached;
  }
  EXPECT_EQ(off.engine->Stats().scheduler.prompt_logprob_tokens_cached, 0u);
  EngineTestPeer::RunWithKvCache(*warm.engine, [](const KvCache& cache) {
    cache.CheckInvariants();
    EXPECT_EQ(cache.Stats().blocks_active, 0);
  });
}

// Scoring requests mixed with plain ones, all submitted at once on a pool small enough to
// preempt: the scores and tokens equal each request alone.
TEST(EngineScoringCpuTest, ConcurrencyAndPreemptionAreInvisible) {
  std::mt19937 rng(21);
  const std::vector<uint32_t> shared = RandomTokens(&rng, 40);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 12; ++i) {
    std::vector<uint32_t> prompt = shared;
    const std::vector<uint32_t> own = RandomTokens(&rng, 2 + i * 2);
    prompt.insert(prompt.end(), own.begin(), own.end());
    // Up to 64 prompt + 23 new tokens: each fits the 88-token pool alone, not together.
    EngineRequest r =
        ScoringRequest(prompt, static_cast<uint32_t>(i % 6), 8 + static_cast<uint32_t>(i % 4) * 5);
    if (i % 3 == 2) r.prompt_logprobs.reset();
    if (i % 4 == 1) r.echo_prompt = true;
    r.num_samples = 1 + i % 2;
    r.sampling = {.temperature = 0.8f, .seed = 100u + i};
    requests.push_back(r);
  }
  std::vector<RequestResult> alone;
  {
    CpuEngine ref({.pool_blocks = 64, .block_size = 8, .prefix_cache = false});
    for (const EngineRequest& r : requests) alone.push_back(RunOne(*ref.engine, r));
  }
  CpuEngine busy({.pool_blocks = 11, .block_size = 8, .max_batch_tokens = 24});
  const std::vector<std::shared_ptr<RequestStream>> streams =
      SubmitTogether(*busy.engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    ASSERT_NE(streams[i], nullptr);
    const RequestResult together = Collect(*streams[i]);
    ASSERT_TRUE(together.status.ok()) << together.status;
    const bool echo = requests[i].prompt_logprobs.has_value() || requests[i].echo_prompt;
    EXPECT_EQ(together.prompt_events, echo ? 1 : 0);
    EXPECT_EQ(together.prompt, alone[i].prompt);
    if (echo) {
      ASSERT_EQ(together.prompt.size(), requests[i].prompt.size());
      for (size_t p = 0; p < requests[i].prompt.size(); ++p) {
        EXPECT_EQ(together.prompt[p].token_id, requests[i].prompt[p]);
        EXPECT_EQ(together.prompt[p].has_logprob,
                  p > 0 && requests[i].prompt_logprobs.has_value());
      }
    }
    ASSERT_EQ(together.samples.size(), alone[i].samples.size());
    for (size_t s = 0; s < together.samples.size(); ++s) {
      EXPECT_EQ(together.samples[s], alone[i].samples[s]) << "sample " << s;
    }
  }
  const EngineStats stats = busy.engine->Stats();
  EXPECT_GT(stats.scheduler.preemptions, 0u);
  EXPECT_GT(stats.scheduler.prompt_logprob_tokens_cached, 0u);
  EngineTestPeer::RunWithKvCache(*busy.engine, [](const KvCache& cache) {
    cache.CheckInvariants();
    EXPECT_EQ(cache.Stats().blocks_active, 0);
  });
}

}  // namespace
}  // namespace prefixd
