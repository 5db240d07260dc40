#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;

SamplingParams Sampled(float temperature, uint32_t top_k = 0, float top_p = 1.0f,
                       uint64_t seed = 7) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

TEST(CounterRandomTest, SameKeySameBitsDistinctKeysDiffer) {
  const SampleKey a{.seed = 1, .sample_index = 0, .position = 10};
  EXPECT_EQ(CounterRandomBits(a), CounterRandomBits(a));
  std::set<uint64_t> seen;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    for (uint32_t s = 0; s < 4; ++s) {
      for (uint32_t pos = 0; pos < 64; ++pos) {
        seen.insert(CounterRandomBits({.seed = seed, .sample_index = s, .position = pos}));
      }
    }
  }
  EXPECT_EQ(seen.size(), 4u * 4u * 64u);
  // Swapping sample index and position must not collide either.
  EXPECT_NE(CounterRandomBits({.seed = 3, .sample_index = 1, .position = 2}),
            CounterRandomBits({.seed = 3, .sample_index = 2, .position = 1}));
}

TEST(CounterRandomTest, UniformInUnitIntervalWithPlausibleMean) {
  double sum = 0.0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double u = CounterUniform({.seed = 42, .sample_index = 0, .position = uint32_t(i)});
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
}

TEST(SamplerTest, GreedyPicksArgmaxWithTiesToLowestId) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  const SampledToken t = SampleToken(logits, Sampled(0.0f), {.seed = 99}, 0);
  EXPECT_EQ(t.token.token_id, 1u);
  EXPECT_THAT(EligibleTokens(logits, Sampled(0.0f)), ElementsAre(1u));
  // Greedy ignores the seed and the position.
  for (uint32_t pos = 0; pos < 50; ++pos) {
    EXPECT_EQ(SampleToken(logits, Sampled(0.0f), {.seed = pos, .position = pos}, 0).token.token_id,
              1u);
  }
}

TEST(SamplerTest, SameKeyGivesSameTokenAndPositionsVary) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.37f);
  std::set<uint32_t> tokens;
  for (uint32_t pos = 0; pos < 200; ++pos) {
    const SampleKey key{.seed = 5, .sample_index = 1, .position = pos};
    const SampledToken a = SampleToken(logits, Sampled(1.0f), key, 3);
    const SampledToken b = SampleToken(logits, Sampled(1.0f), key, 3);
    ASSERT_EQ(a.token.token_id, b.token.token_id);
    ASSERT_EQ(a.token.logprob, b.token.logprob);
    tokens.insert(a.token.token_id);
  }
  EXPECT_GT(tokens.size(), 30u);  // near-flat distribution over 100 ids: many distinct draws
}

TEST(SamplerTest, TopKMaskKeepsTheKLargestTiesByLowerId) {
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 5.0f, 2.0f, 3.0f};
  EXPECT_THAT(EligibleTokens(logits, Sampled(1.0f, 2)), ElementsAre(1u, 3u));
  EXPECT_THAT(EligibleTokens(logits, Sampled(1.0f, 3)), ElementsAre(1u, 3u, 2u));
  std::set<uint32_t> drawn;
  for (uint32_t pos = 0; pos < 500; ++pos) {
    drawn.insert(
        SampleToken(logits, Sampled(5.0f, 3), {.seed = 1, .position = pos}, 0).token.token_id);
  }
  EXPECT_EQ(drawn, (std::set<uint32_t>{1u, 2u, 3u}));
}

TEST(SamplerTest, TopPMaskKeepsSmallestPrefixReachingP) {
  const std::vector<float> logits = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  EXPECT_THAT(EligibleTokens(logits, Sampled(1.0f, 0, 0.5f)), ElementsAre(1u));
  EXPECT_THAT(EligibleTokens(logits, Sampled(1.0f, 0, 0.7f)), ElementsAre(1u, 2u));
  EXPECT_THAT(EligibleTokens(logits, Sampled(1.0f, 0, 0.85f)), ElementsAre(1u, 2u, 0u));
  // top-k applies first: with k = 2 the mass is renormalised over {1, 2} (0.625, 0.375).
  EXPECT_THAT(EligibleTokens(logits, Sampled(1.0f, 2, 0.6f)), ElementsAre(1u));
  EXPECT_THAT(EligibleTokens(logits, Sampled(1.0f, 2, 0.65f)), ElementsAre(1u, 2u));
  std::set<uint32_t> drawn;
  for (uint32_t pos = 0; pos < 500; ++pos) {
    drawn.insert(SampleToken(logits, Sampled(1.0f, 0, 0.7f), {.seed = 3, .position = pos}, 0)
                     .token.token_id);
  }
  EXPECT_EQ(drawn, (std::set<uint32_t>{1u, 2u}));
}

TEST(SamplerTest, DrawFrequenciesFollowTheTemperedDistribution) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<uint32_t, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    ++count[SampleToken(logits, Sampled(1.0f), {.seed = 11, .position = uint32_t(i)}, 0)
                .token.token_id];
  }
  EXPECT_NEAR(count[0] / double(n), 0.5, 0.02);
  EXPECT_NEAR(count[1] / double(n), 0.3, 0.02);
  EXPECT_NEAR(count[2] / double(n), 0.2, 0.02);
  // Temperature 2 flattens: p ∝ sqrt(p0) → 0.414, 0.321, 0.262.
  count.clear();
  for (int i = 0; i < n; ++i) {
    ++count[SampleToken(logits, Sampled(2.0f), {.seed = 11, .position = uint32_t(i)}, 0)
                .token.token_id];
  }
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.2);
  EXPECT_NEAR(count[0] / double(n), std::sqrt(0.5) / z, 0.02);
  EXPECT_NEAR(count[2] / double(n), std::sqrt(0.2) / z, 0.02);
}

TEST(SamplerTest, LogprobsAreOfRawLogitsAndTopIsSortedTiesByLowerId) {
  const std::vector<float> logits = {2.0f, 1.0f, 2.0f, -3.0f, 0.5f};
  double z = 0.0;
  for (float l : logits) z += std::exp(double(l));
  auto raw = [&](uint32_t id) { return float(double(logits[id]) - std::log(z)); };
  // Temperature, top-k and top-p shape the draw, not the reported log-probabilities.
  const SampledToken t = SampleToken(logits, Sampled(3.0f, 2, 0.9f), {.seed = 2, .position = 4}, 4);
  EXPECT_TRUE(t.token.token_id == 0u || t.token.token_id == 2u);
  EXPECT_FLOAT_EQ(t.token.logprob, raw(t.token.token_id));
  ASSERT_EQ(t.top.size(), 4u);
  EXPECT_EQ(t.top[0].token_id, 0u);
  EXPECT_EQ(t.top[1].token_id, 2u);
  EXPECT_EQ(t.top[2].token_id, 1u);
  EXPECT_EQ(t.top[3].token_id, 4u);
  for (const TokenLogprob& e : t.top) EXPECT_FLOAT_EQ(e.logprob, raw(e.token_id));
  EXPECT_EQ(t.top[0].logprob, t.top[1].logprob);
  // More entries than the vocabulary: all of it.
  EXPECT_EQ(SampleToken(logits, Sampled(0.0f), {}, 20).top.size(), logits.size());
  EXPECT_TRUE(SampleToken(logits, Sampled(0.0f), {}, 0).top.empty());
}

// A GPT-2-sized row: the vocabulary loops run in vector lanes with their own exp, so check
// them against a double-precision log-softmax, including logits far below the maximum
// (exp underflows there) and a tie for the maximum split across lanes and the tail.
TEST(SamplerTest, FullVocabularyLogprobsMatchDoublePrecisionAndArgmaxTakesLowestId) {
  const uint32_t vocab = 50257;  // 8 * 6282 + 1: one entry past the lanes
  std::vector<float> logits(vocab);
  uint64_t state = 12345;
  for (float& l : logits) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    l = static_cast<float>(static_cast<int64_t>(state >> 40) % 2000) / 100.0f - 10.0f;
  }
  logits[17] = -150.0f;
  logits[18] = -1e30f;
  logits[vocab - 1] = 12.5f;  // the maximum, in the tail after the last full lane group
  logits[43] = 12.5f;         // the same maximum earlier: greedy must take 43
  double z = 0.0;
  for (float l : logits) z += std::exp(double(l) - 12.5);
  auto reference = [&](uint32_t id) { return double(logits[id]) - 12.5 - std::log(z); };

  const SampledToken greedy = SampleToken(logits, Sampled(0.0f), {}, 20);
  EXPECT_EQ(greedy.token.token_id, 43u);
  EXPECT_NEAR(greedy.token.logprob, reference(43), 2e-6);
  ASSERT_EQ(greedy.top.size(), 20u);
  EXPECT_EQ(greedy.top[0].token_id, 43u);
  EXPECT_EQ(greedy.top[1].token_id, vocab - 1);
  for (const TokenLogprob& e : greedy.top) EXPECT_NEAR(e.logprob, reference(e.token_id), 2e-6);

  // Sampled draws report the same raw log-probabilities, and only draw eligible tokens.
  for (uint32_t pos = 0; pos < 50; ++pos) {
    const SampledToken t = SampleToken(logits, Sampled(0.7f), {.seed = 3, .position = pos}, 0);
    ASSERT_LT(t.token.token_id, vocab);
    EXPECT_NE(t.token.token_id, 17u);
    EXPECT_NE(t.token.token_id, 18u);
    EXPECT_NEAR(t.token.logprob, reference(t.token.token_id), 2e-6);
  }
}

// top-p over a GPT-2-sized vocabulary against a brute-force nucleus: rank everything (logit
// descending, ties by lower id), take the smallest prefix whose mass reaches top_p.
TEST(SamplerTest, TopPOverAFullVocabularyMatchesRankingEverything) {
  const uint32_t vocab = 50257;
  std::vector<float> logits(vocab);
  uint64_t state = 99;
  for (float& l : logits) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    // A sum of uniforms: roughly normal, with repeated values (two decimals), so that ties
    // straddle bucket and nucleus boundaries.
    double u = 0.0;
    for (int k = 0; k < 4; ++k) u += static_cast<double>((state >> (16 * k)) & 0xffff) / 65536.0;
    l = static_cast<float>(std::round((u - 2.0) * 400.0) / 100.0);
  }
  for (float temperature : {0.7f, 1.0f, 1.5f}) {
    for (float top_p : {0.05f, 0.5f, 0.9f, 0.99f}) {
      std::vector<uint32_t> order(vocab);
      for (uint32_t i = 0; i < vocab; ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
      });
      const double max = logits[order[0]];
      double total = 0.0;
      for (float l : logits) total += std::exp((double(l) - max) / temperature);
      std::vector<uint32_t> want;
      double cumulative = 0.0;
      for (uint32_t id : order) {
        want.push_back(id);
        cumulative += std::exp((double(logits[id]) - max) / temperature);
        if (cumulative >= top_p * total) break;
      }
      const std::vector<uint32_t> got = EligibleTokens(logits, Sampled(temperature, 0, top_p));
      EXPECT_EQ(got, want) << "temperature " << temperature << " top_p " << top_p << ": "
                           << got.size() << " tokens against " << want.size();
    }
  }
  // The top log-probabilities over the same tie-heavy row: the first 20 of the full ranking.
  std::vector<uint32_t> order(vocab);
  for (uint32_t i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (uint32_t n : {1u, 5u, 20u}) {
    const SampledToken t = SampleToken(logits, Sampled(0.0f), {}, n);
    std::vector<uint32_t> top;
    for (const TokenLogprob& e : t.top) top.push_back(e.token_id);
    EXPECT_EQ(top, std::vector<uint32_t>(order.begin(), order.begin() + n)) << n;
  }
  // Ties for the last place go to the lower ids: e, e, e, e, 1 with half the mass = 3 e's.
  const std::vector<float> tied = {1.0f, 1.0f, 1.0f, 1.0f, 0.0f};
  EXPECT_THAT(EligibleTokens(tied, Sampled(1.0f, 0, 0.5f)), ElementsAre(0u, 1u, 2u));
}

}  // namespace
}  // namespace prefixd
