#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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

// The penalties and logit_bias, written the slow way from their definitions: every id of
// the vocabulary, its bias found by scanning the list, its occurrences counted by scanning
// the prompt and the generated tokens.
std::vector<float> SlowProcessedLogits(const std::vector<float>& logits, const SamplingParams& p,
                                       const std::vector<uint32_t>& prompt,
                                       const std::vector<uint32_t>& generated) {
  std::vector<float> out(logits.size());
  for (uint32_t id = 0; id < logits.size(); ++id) {
    float l = logits[id];
    for (const TokenBias& b : p.logit_bias) {
      if (b.token_id == id) l = l + b.bias;
    }
    bool in_prompt = false;
    for (uint32_t t : prompt) in_prompt = in_prompt || t == id;
    uint32_t count = 0;
    for (uint32_t t : generated) count += t == id ? 1 : 0;
    // Hugging Face's RepetitionPenaltyLogitsProcessor: score < 0 ? score * p : score / p.
    if (in_prompt || count > 0) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    // OpenAI: mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence.
    l = l - static_cast<float>(count) * p.frequency_penalty;
    if (count > 0) l = l - p.presence_penalty;
    out[id] = l;
  }
  return out;
}

struct History {
  absl::flat_hash_set<uint32_t> prompt_set;
  absl::flat_hash_map<uint32_t, uint32_t> counts;
  SampleHistory view() const { return {.prompt_tokens = &prompt_set, .generated_counts = &counts}; }
};

History MakeHistory(const std::vector<uint32_t>& prompt, const std::vector<uint32_t>& generated) {
  History h;
  h.prompt_set.insert(prompt.begin(), prompt.end());
  for (uint32_t t : generated) ++h.counts[t];
  return h;
}

TEST(SamplerPenaltyTest, PenaltiesAndBiasMatchTheirDefinitions) {
  std::mt19937 rng(11);
  const uint32_t vocab = 300;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<uint32_t> tok(0, 59);  // a small alphabet: many repeats
  int processed_rows = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(vocab);
    for (float& l : logits) l = normal(rng);
    std::vector<uint32_t> prompt, generated;
    for (int i = 0; i < 1 + trial % 40; ++i) prompt.push_back(tok(rng));
    for (int i = 0; i < trial % 30; ++i) generated.push_back(tok(rng) + 20);  // overlaps, not all
    SamplingParams p = Sampled(trial % 5 == 0 ? 0.0f : 0.8f, trial % 3 == 0 ? 0u : 50u,
                               trial % 4 == 0 ? 0.9f : 1.0f, 500 + trial);
    const float reps[] = {1.0f, 1.3f, 0.7f, 2.0f};
    const float pens[] = {0.0f, 0.5f, -0.4f, 2.0f, -2.0f};
    p.repetition_penalty = reps[trial % 4];
    p.frequency_penalty = pens[trial % 5];
    p.presence_penalty = pens[(trial / 5) % 5];
    p.min_p = trial % 7 == 0 ? 0.05f : 0.0f;
    for (int b = 0; b < trial % 6; ++b) {
      p.logit_bias.push_back({static_cast<uint32_t>(b * 37 + trial) % vocab,
                              static_cast<float>(b * 40 - 100)});
    }
    const History h = MakeHistory(prompt, generated);
    const std::vector<float> want = SlowProcessedLogits(logits, p, prompt, generated);
    std::vector<float> got;
    ProcessLogits(logits, p, h.view(), &got);
    ASSERT_EQ(got, want) << "trial " << trial;  // bit for bit
    if (got != logits) {
      ++processed_rows;
      EXPECT_TRUE(ProcessesLogits(p)) << "trial " << trial;
    }

    // The draw is the draw from the processed logits with nothing processed, and the
    // reported log-probabilities are the raw logits' ones.
    SamplingParams plain = p;
    plain.repetition_penalty = 1.0f;
    plain.frequency_penalty = plain.presence_penalty = 0.0f;
    plain.logit_bias.clear();
    for (uint32_t pos = 0; pos < 8; ++pos) {
      const SampleKey key{.seed = p.seed, .sample_index = 1, .position = pos};
      const SampledToken t = SampleToken(logits, p, key, 3, h.view());
      const SampledToken from_processed = SampleToken(want, plain, key, 0);
      const SampledToken raw = SampleToken(logits, plain, key, 3);
      ASSERT_EQ(t.token.token_id, from_processed.token.token_id) << "trial " << trial;
      const SampledToken raw_of_chosen = SampleToken(logits, Sampled(0.0f), key, vocab);
      for (const TokenLogprob& e : raw_of_chosen.top) {
        if (e.token_id == t.token.token_id) {
          EXPECT_EQ(t.token.logprob, e.logprob);
        }
      }
      ASSERT_EQ(t.top.size(), raw.top.size());
      for (size_t i = 0; i < t.top.size(); ++i) {
        EXPECT_EQ(t.top[i].token_id, raw.top[i].token_id);
        EXPECT_EQ(t.top[i].logprob, raw.top[i].logprob);
      }
    }
  }
  EXPECT_GT(processed_rows, 150);
}

TEST(SamplerPenaltyTest, PenaltiesSteerGreedyDecoding) {
  // Token 2 leads by 1; token 5 is second.
  std::vector<float> logits(10, 0.0f);
  logits[2] = 3.0f;
  logits[5] = 2.0f;
  const History twice = MakeHistory({}, {2, 2});
  SamplingParams p = Sampled(0.0f);
  EXPECT_EQ(SampleToken(logits, p, {}, 0, twice.view()).token.token_id, 2u);
  p.frequency_penalty = 0.4f;  // 3 - 2 * 0.4 = 2.2 > 2
  EXPECT_EQ(SampleToken(logits, p, {}, 0, twice.view()).token.token_id, 2u);
  p.frequency_penalty = 0.6f;  // 3 - 1.2 = 1.8 < 2
  EXPECT_EQ(SampleToken(logits, p, {}, 0, twice.view()).token.token_id, 5u);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 1.5f;  // counts once: 1.5 < 2
  EXPECT_EQ(SampleToken(logits, p, {}, 0, twice.view()).token.token_id, 5u);
  p.presence_penalty = 0.0f;
  // Repetition over the prompt: 3 / 1.6 < 2; a token only in neither is untouched.
  const History in_prompt = MakeHistory({2, 7}, {});
  p.repetition_penalty = 1.6f;
  EXPECT_EQ(SampleToken(logits, p, {}, 0, in_prompt.view()).token.token_id, 5u);
  p.repetition_penalty = 1.4f;  // 3 / 1.4 > 2
  EXPECT_EQ(SampleToken(logits, p, {}, 0, in_prompt.view()).token.token_id, 2u);
  // A negative penalty encourages: presence -2 lifts token 5 when it was generated.
  p.repetition_penalty = 1.0f;
  const History five = MakeHistory({}, {5});
  p.presence_penalty = -1.5f;
  EXPECT_EQ(SampleToken(logits, p, {}, 0, five.view()).token.token_id, 5u);
  p.presence_penalty = 0.0f;
  // logit_bias -100 bans the leader, +100 forces a nobody; the logprob stays raw.
  p.logit_bias = {{2, -100.0f}};
  EXPECT_EQ(SampleToken(logits, p, {}, 0).token.token_id, 5u);
  p.logit_bias = {{9, 100.0f}};
  const SampledToken forced = SampleToken(logits, p, {}, 0);
  EXPECT_EQ(forced.token.token_id, 9u);
  EXPECT_EQ(forced.token.logprob, SampleToken(logits, Sampled(0.0f), {}, 10).top.back().logprob);
  // Sampled at temperature 1, a banned token never comes out.
  SamplingParams sampled = Sampled(1.0f);
  sampled.logit_bias = {{2, -100.0f}};
  for (uint32_t pos = 0; pos < 300; ++pos) {
    EXPECT_NE(SampleToken(logits, sampled, {.seed = 8, .position = pos}, 0).token.token_id, 2u);
  }
}

TEST(SamplerPenaltyTest, MinPKeepsTokensAtLeastThatFractionOfTheMostLikely) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (and nothing for the rest).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), -1e4f, std::log(0.05f),
                                     std::log(0.3f)};
  SamplingParams p = Sampled(1.0f);
  p.min_p = 0.2f;  // keeps p >= 0.1
  EXPECT_THAT(EligibleTokens(logits, p), ElementsAre(1u, 4u, 0u));
  p.min_p = 0.7f;  // 0.3 / 0.5 = 0.6 < 0.7
  EXPECT_THAT(EligibleTokens(logits, p), ElementsAre(1u));
  p.min_p = 0.05f;
  EXPECT_THAT(EligibleTokens(logits, p), ElementsAre(1u, 4u, 0u, 3u));
  p.min_p = 0.0f;  // off: every token
  EXPECT_EQ(EligibleTokens(logits, p).size(), 5u);
  // min_p first, then top-k and top-p over its survivors (vLLM's order).
  p.min_p = 0.2f;
  p.top_k = 2;
  EXPECT_THAT(EligibleTokens(logits, p), ElementsAre(1u, 4u));
  p.top_k = 0;
  p.top_p = 0.55f;  // of the survivors' 0.95: 0.5 < 0.5225 <= 0.8
  EXPECT_THAT(EligibleTokens(logits, p), ElementsAre(1u, 4u));
  // At temperature 2 the probabilities flatten (sqrt): 0.05 -> sqrt(0.1) = 0.32 of the top.
  p = Sampled(2.0f);
  p.min_p = 0.3f;
  EXPECT_THAT(EligibleTokens(logits, p), ElementsAre(1u, 4u, 0u, 3u));
  // And the draw keeps to them.
  p = Sampled(1.0f);
  p.min_p = 0.2f;
  std::set<uint32_t> drawn;
  for (uint32_t pos = 0; pos < 500; ++pos) {
    drawn.insert(SampleToken(logits, p, {.seed = 4, .position = pos}, 0).token.token_id);
  }
  EXPECT_EQ(drawn, (std::set<uint32_t>{0u, 1u, 4u}));
}

}  // namespace
}  // namespace prefixd
