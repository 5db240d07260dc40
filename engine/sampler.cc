#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cache/check.h"

namespace prefixd {
namespace {

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijection on 64 bits with full
// avalanche, so chaining it over the key's fields separates every distinct key.
uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Most likely first, ties by lower id: the one order every ranking here uses.
struct ByLogitDesc {
  absl::Span<const float> logits;
  bool operator()(uint32_t a, uint32_t b) const {
    if (logits[a] != logits[b]) return logits[a] > logits[b];
    return a < b;
  }
};

uint32_t Argmax(absl::Span<const float> logits) {
  uint32_t best = 0;
  for (uint32_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lower id
  }
  return best;
}

// The `m` most likely ids in ByLogitDesc order, without sorting the whole vocabulary: a
// linear insertion pass for small m (top_logprobs, small top-k), nth_element otherwise.
std::vector<uint32_t> SortedPrefix(absl::Span<const float> logits, uint32_t m) {
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  m = std::min(m, vocab);
  const ByLogitDesc order{logits};
  std::vector<uint32_t> ids;
  if (m == 0) return ids;
  if (m <= 32) {
    ids.reserve(m + 1);
    for (uint32_t i = 0; i < vocab; ++i) {
      if (ids.size() == m && !order(i, ids.back())) continue;
      ids.insert(std::upper_bound(ids.begin(), ids.end(), i, order), i);
      if (ids.size() > m) ids.pop_back();
    }
    return ids;
  }
  ids.resize(vocab);
  for (uint32_t i = 0; i < vocab; ++i) ids[i] = i;
  if (m < vocab) std::nth_element(ids.begin(), ids.begin() + (m - 1), ids.end(), order);
  ids.resize(m);
  std::sort(ids.begin(), ids.end(), order);
  return ids;
}

// exp((l - max) / t) in float (fast, and deterministic for given inputs); sums are kept in
// double so that 50k small terms do not lose the tail.
inline float Weight(float logit, float max, float t) { return std::exp((logit - max) / t); }

// Candidates after top-k and top-p, most likely first. Empty means "no mask": every token,
// in id order (no ranking needed in the common unmasked case).
std::vector<uint32_t> MaskedCandidates(absl::Span<const float> logits,
                                       const SamplingParams& params) {
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  const bool use_k = params.top_k > 0 && params.top_k < vocab;
  const bool use_p = params.top_p < 1.0f;
  if (!use_k && !use_p) return {};
  const uint32_t bound = use_k ? params.top_k : vocab;
  if (!use_p) return SortedPrefix(logits, bound);
  // top-p over the top-k survivors (or the whole vocabulary) at this temperature: the
  // smallest most-likely prefix whose mass reaches top_p (at least one token). The mass is
  // usually in a few dozen tokens, so rank a growing prefix instead of everything.
  const float t = params.temperature;
  const float max = logits[Argmax(logits)];
  double total = 0.0;
  if (use_k) {
    for (uint32_t id : SortedPrefix(logits, bound)) total += Weight(logits[id], max, t);
  } else {
    for (float l : logits) total += Weight(l, max, t);
  }
  const double target = static_cast<double>(params.top_p) * total;
  for (uint32_t m = std::min<uint32_t>(bound, 64);; m = std::min<uint32_t>(bound, m * 8)) {
    std::vector<uint32_t> ids = SortedPrefix(logits, m);
    double cumulative = 0.0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cumulative += Weight(logits[ids[i]], max, t);
      if (cumulative >= target) {
        ids.resize(i + 1);
        return ids;
      }
    }
    if (m == bound) return ids;  // rounding: the whole set
  }
}

}  // namespace

uint64_t CounterRandomBits(const SampleKey& key) {
  uint64_t h = Mix64(key.seed);
  h = Mix64(h ^ (static_cast<uint64_t>(key.sample_index) << 32 | key.position));
  return Mix64(h);
}

double CounterUniform(const SampleKey& key) {
  return static_cast<double>(CounterRandomBits(key) >> 11) * 0x1.0p-53;
}

std::vector<uint32_t> EligibleTokens(absl::Span<const float> logits, const SamplingParams& params) {
  PREFIXD_CHECK(!logits.empty());
  if (params.temperature == 0.0f) return {Argmax(logits)};
  std::vector<uint32_t> ids = MaskedCandidates(logits, params);
  if (ids.empty()) ids = SortedPrefix(logits, static_cast<uint32_t>(logits.size()));
  return ids;
}

SampledToken SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                         const SampleKey& key, uint32_t top_logprobs) {
  PREFIXD_CHECK(!logits.empty());
  const uint32_t vocab = static_cast<uint32_t>(logits.size());

  const float max = logits[Argmax(logits)];
  uint32_t chosen;
  if (params.temperature == 0.0f) {
    chosen = Argmax(logits);
  } else {
    const std::vector<uint32_t> masked = MaskedCandidates(logits, params);
    const uint32_t n = masked.empty() ? vocab : static_cast<uint32_t>(masked.size());
    auto id_at = [&](uint32_t i) { return masked.empty() ? i : masked[i]; };
    const float t = params.temperature;
    double total = 0.0;
    for (uint32_t i = 0; i < n; ++i) total += Weight(logits[id_at(i)], max, t);
    const double target = CounterUniform(key) * total;
    double cumulative = 0.0;
    chosen = id_at(n - 1);  // rounding can leave target just above the last partial sum
    for (uint32_t i = 0; i < n; ++i) {
      cumulative += Weight(logits[id_at(i)], max, t);
      if (target < cumulative) {
        chosen = id_at(i);
        break;
      }
    }
  }

  // log-softmax of the raw logits: l - max - log(sum exp(l - max)).
  double sum = 0.0;
  for (float l : logits) sum += Weight(l, max, 1.0f);
  const double log_z = static_cast<double>(max) + std::log(sum);
  auto logprob = [&](uint32_t id) {
    return static_cast<float>(static_cast<double>(logits[id]) - log_z);
  };

  SampledToken out;
  out.token = {chosen, logprob(chosen)};
  for (uint32_t id : SortedPrefix(logits, top_logprobs)) out.top.push_back({id, logprob(id)});
  return out;
}

}  // namespace prefixd
