#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/check.h"

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

// The loops below run once per generated token over the whole vocabulary (50k entries for
// GPT-2), on the engine thread between backend steps, while the backend's threads wait. Each
// is written in 8 independent lanes, which the compiler turns into vector code (this file is
// built with -O3 for x86-64-v3, the kernels' baseline), and each result depends only on the
// row: the lanes and their final order are fixed, whatever else is in the batch.
constexpr size_t kLanes = 8;

// The largest logit. `a > b ? a : b` per lane is a vector max; a max is exact, so the lane
// grouping cannot change it.
float MaxLogit(absl::Span<const float> logits) {
  float lane[kLanes];
  for (size_t j = 0; j < kLanes; ++j) lane[j] = logits[0];
  size_t i = 0;
  for (; i + kLanes <= logits.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = lane[j] > logits[i + j] ? lane[j] : logits[i + j];
  }
  float m = lane[0];
  for (size_t j = 1; j < kLanes; ++j) m = m > lane[j] ? m : lane[j];
  for (; i < logits.size(); ++i) m = m > logits[i] ? m : logits[i];
  return m;
}

// The lowest id holding the largest logit (a NaN row gives 0).
uint32_t Argmax(absl::Span<const float> logits) {
  const float m = MaxLogit(logits);
  for (uint32_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == m) return i;
  }
  return 0;
}

// exp(x) for x <= 0, in float, within 2 ulp (Cephes' expf: x = n ln2 + r with ln2 split in
// two, a degree-6 polynomial for exp(r), then 2^n from the exponent bits). Branch-free so
// that a loop of it vectorises. Below -87.3 (where exp leaves the normal floats) and for NaN
// it returns exp(-87.3) ~ 1e-38, nothing next to the 1 that the maximum contributes.
inline float ExpOfNonPositive(float x) {
  x = x >= -87.3f ? x : -87.3f;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// w[i] = exp((logits[i] - max) / t) for the whole row, t > 0.
void Weights(absl::Span<const float> logits, float max, float t, std::vector<float>* w) {
  w->resize(logits.size());
  float* out = w->data();
  const float* in = logits.data();
  const size_t n = logits.size();
  if (t == 1.0f) {
    for (size_t i = 0; i < n; ++i) out[i] = ExpOfNonPositive(in[i] - max);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = ExpOfNonPositive((in[i] - max) / t);
  }
}

// Sum of w in double (50k small terms must not lose the tail), lane j adding the entries
// i = j mod 8 in order, then the lanes in order.
double SumWeights(const std::vector<float>& w) {
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= w.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(w[i + j]);
  }
  double sum = 0.0;
  for (size_t j = 0; j < kLanes; ++j) sum += lane[j];
  for (; i < w.size(); ++i) sum += static_cast<double>(w[i]);
  return sum;
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
    constexpr uint32_t kChunk = 32;
    for (uint32_t i = 0; i < vocab; ++i) {
      if (ids.size() == m && i % kChunk == 0 && i + kChunk <= vocab) {
        // A whole chunk whose largest logit is at most the m-th best is skipped at once (a
        // tie cannot enter either: the chunk's ids are all higher). Most chunks are.
        float chunk_max = logits[i];
        for (uint32_t j = 1; j < kChunk; ++j) {
          chunk_max = chunk_max > logits[i + j] ? chunk_max : logits[i + j];
        }
        if (chunk_max <= logits[ids.back()]) {
          i += kChunk - 1;
          continue;
        }
      }
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

// A float's bits as an unsigned key in the same order as the floats (NaN aside).
inline uint32_t OrderKey(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

// top-p over the whole vocabulary: the smallest most-likely prefix (ties by lower id) whose
// weight reaches `target`, found without ranking the vocabulary. Each token's weight goes to
// the bucket of its logit's top 16 key bits (a relative width of 1/128); the buckets are
// added from the top until they reach the target, and only the bucket where that happens is
// ranked. Returns the tokens of the higher buckets in id order, then the boundary bucket's
// most likely first; `w` holds the weights at this temperature.
std::vector<uint32_t> Nucleus(absl::Span<const float> logits, const std::vector<float>& w,
                              double target) {
  constexpr int kBuckets = 1 << 16;
  thread_local std::vector<double> mass;
  mass.assign(kBuckets, 0.0);
  const size_t n = logits.size();
  for (size_t i = 0; i < n; ++i) mass[OrderKey(logits[i]) >> 16] += static_cast<double>(w[i]);
  int boundary = -1;
  double above = 0.0;  // the weight of the buckets above the boundary
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (mass[b] == 0.0) continue;
    boundary = b;  // rounding can leave the target unreached: then the lowest is the boundary
    if (above + mass[b] >= target) break;
    above += mass[b];
  }
  std::vector<uint32_t> ids, edge;
  for (uint32_t i = 0; i < n; ++i) {
    const int b = static_cast<int>(OrderKey(logits[i]) >> 16);
    if (b > boundary) {
      ids.push_back(i);
    } else if (b == boundary) {
      edge.push_back(i);
    }
  }
  std::sort(edge.begin(), edge.end(), ByLogitDesc{logits});
  double cumulative = above;
  for (uint32_t id : edge) {
    ids.push_back(id);
    cumulative += static_cast<double>(w[id]);
    if (cumulative >= target) break;
  }
  if (ids.empty()) ids.push_back(Argmax(logits));  // every weight was zero or NaN
  return ids;
}

// Keeps the smallest prefix of `ids` (most likely first) whose mass reaches top_p of
// theirs (at least one token).
void TruncateToMass(const std::vector<float>& w, float top_p, std::vector<uint32_t>* ids) {
  double total = 0.0;
  for (uint32_t id : *ids) total += static_cast<double>(w[id]);
  const double target = static_cast<double>(top_p) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < ids->size(); ++i) {
    cumulative += static_cast<double>(w[(*ids)[i]]);
    if (cumulative >= target) {
      ids->resize(i + 1);
      break;
    }
  }
}

// Candidates after min_p, top-k and top-p, in vLLM's order (min_p first, then top-k and
// top-p over its survivors). Empty means "no mask": every token, in id order. Top-k alone
// gives the k most likely first; top-p alone see Nucleus() for the order. `w` holds the
// weights at this temperature, w = exp((l - max) / t), so the most likely token's is 1.
std::vector<uint32_t> MaskedCandidates(absl::Span<const float> logits,
                                       const SamplingParams& params, const std::vector<float>& w) {
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  const bool use_k = params.top_k > 0 && params.top_k < vocab;
  const bool use_p = params.top_p < 1.0f;
  if (params.min_p > 0.0f) {
    // p_i < min_p * p_max  <=>  w_i < min_p, since p_i = w_i / Σw and w_max = 1. The
    // survivors are a most-likely prefix (w grows with the logit), so top-k of them is the
    // first k.
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < vocab; ++i) {
      if (w[i] >= params.min_p) ids.push_back(i);
    }
    if (ids.empty()) ids.push_back(Argmax(logits));  // NaN weights
    std::sort(ids.begin(), ids.end(), ByLogitDesc{logits});
    if (use_k && ids.size() > params.top_k) ids.resize(params.top_k);
    if (use_p) TruncateToMass(w, params.top_p, &ids);
    return ids;
  }
  if (!use_k && !use_p) return {};
  if (!use_p) return SortedPrefix(logits, params.top_k);
  if (!use_k) return Nucleus(logits, w, static_cast<double>(params.top_p) * SumWeights(w));
  // top-p over the top-k survivors.
  std::vector<uint32_t> ids = SortedPrefix(logits, params.top_k);
  TruncateToMass(w, params.top_p, &ids);
  return ids;
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

SampledToken ScoreToken(absl::Span<const float> logits, uint32_t token, uint32_t top_n) {
  PREFIXD_CHECK(!logits.empty() && token < logits.size());
  thread_local std::vector<float> weights;
  const float max = MaxLogit(logits);
  Weights(logits, max, 1.0f, &weights);
  const double log_z = static_cast<double>(max) + std::log(SumWeights(weights));
  auto logprob = [&](uint32_t id) {
    return static_cast<float>(static_cast<double>(logits[id]) - log_z);
  };
  SampledToken out;
  out.token = {token, logprob(token)};
  for (uint32_t id : SortedPrefix(logits, top_n)) out.top.push_back({id, logprob(id)});
  return out;
}

bool ProcessesLogits(const SamplingParams& params) {
  return !params.logit_bias.empty() || params.repetition_penalty != 1.0f ||
         params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
}

void ProcessLogits(absl::Span<const float> logits, const SamplingParams& params,
                   const SampleHistory& history, std::vector<float>* out) {
  out->assign(logits.begin(), logits.end());
  float* l = out->data();
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  for (const TokenBias& b : params.logit_bias) {
    PREFIXD_CHECK(b.token_id < vocab);
    l[b.token_id] += b.bias;
  }
  const float rep = params.repetition_penalty;
  auto repeat = [&](uint32_t id) {
    PREFIXD_CHECK(id < vocab);
    l[id] = l[id] > 0.0f ? l[id] / rep : l[id] * rep;
  };
  const absl::flat_hash_map<uint32_t, uint32_t>* counts = history.generated_counts;
  if (rep != 1.0f) {
    // Once per distinct id of prompt ∪ generated.
    if (history.prompt_tokens != nullptr) {
      for (uint32_t id : *history.prompt_tokens) repeat(id);
    }
    if (counts != nullptr) {
      for (const auto& [id, count] : *counts) {
        if (count > 0 && (history.prompt_tokens == nullptr || !history.prompt_tokens->contains(id))) {
          repeat(id);
        }
      }
    }
  }
  if (counts != nullptr &&
      (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f)) {
    for (const auto& [id, count] : *counts) {
      if (count == 0) continue;
      PREFIXD_CHECK(id < vocab);
      l[id] -= static_cast<float>(count) * params.frequency_penalty;
      l[id] -= params.presence_penalty;
    }
  }
}

std::vector<uint32_t> EligibleTokens(absl::Span<const float> logits, const SamplingParams& params) {
  PREFIXD_CHECK(!logits.empty());
  if (params.temperature == 0.0f) return {Argmax(logits)};
  std::vector<float> w;
  Weights(logits, MaxLogit(logits), params.temperature, &w);
  std::vector<uint32_t> ids = MaskedCandidates(logits, params, w);
  if (ids.empty()) ids = SortedPrefix(logits, static_cast<uint32_t>(logits.size()));
  std::sort(ids.begin(), ids.end(), ByLogitDesc{logits});
  return ids;
}

SampledToken SampleToken(absl::Span<const float> raw_logits, const SamplingParams& params,
                         const SampleKey& key, uint32_t top_logprobs,
                         const SampleHistory& history) {
  PREFIXD_CHECK(!raw_logits.empty());
  // Per-thread buffers: a row's weights are 200 KB, and allocating them per token would
  // map and fault fresh pages every time.
  thread_local std::vector<float> raw_weights;
  thread_local std::vector<float> tempered_weights;
  thread_local std::vector<float> processed;
  const bool processes = ProcessesLogits(params);
  if (processes) ProcessLogits(raw_logits, params, history, &processed);
  // The draw reads `logits`; the log-probabilities read `raw_logits`.
  const absl::Span<const float> logits =
      processes ? absl::Span<const float>(processed) : raw_logits;

  // log-softmax of the raw logits: l - max - log(sum exp(l - max)).
  const float raw_max = MaxLogit(raw_logits);
  Weights(raw_logits, raw_max, 1.0f, &raw_weights);
  const double log_z = static_cast<double>(raw_max) + std::log(SumWeights(raw_weights));
  auto logprob = [&](uint32_t id) {
    return static_cast<float>(static_cast<double>(raw_logits[id]) - log_z);
  };

  uint32_t chosen;
  const float t = params.temperature;
  if (t == 0.0f) {
    chosen = Argmax(logits);
  } else {
    // The weights of the processed logits at this temperature (the raw ones when nothing
    // is processed and t = 1).
    const std::vector<float>* w = &raw_weights;
    if (t != 1.0f || processes) {
      Weights(logits, processes ? MaxLogit(logits) : raw_max, t, &tempered_weights);
      w = &tempered_weights;
    }
    const std::vector<uint32_t> masked = MaskedCandidates(logits, params, *w);
    double total = 0.0;
    if (masked.empty()) {
      // Every token, in id order, summed in lanes.
      total = SumWeights(*w);
      const double target = CounterUniform(key) * total;
      double cumulative = 0.0;
      chosen = static_cast<uint32_t>(w->size() - 1);  // rounding can leave target past the end
      for (size_t i = 0; i < w->size(); ++i) {
        cumulative += static_cast<double>((*w)[i]);
        if (target < cumulative) {
          chosen = static_cast<uint32_t>(i);
          break;
        }
      }
    } else {
      for (uint32_t id : masked) total += static_cast<double>((*w)[id]);
      const double target = CounterUniform(key) * total;
      double cumulative = 0.0;
      chosen = masked.back();  // rounding can leave target just above the last partial sum
      for (uint32_t id : masked) {
        cumulative += static_cast<double>((*w)[id]);
        if (target < cumulative) {
          chosen = id;
          break;
        }
      }
    }
  }

  SampledToken out;
  out.token = {chosen, logprob(chosen)};
  for (uint32_t id : SortedPrefix(raw_logits, top_logprobs)) {
    out.top.push_back({id, logprob(id)});
  }
  return out;
}

}  // namespace prefixd
