// Token sampling from one row of logits.
//
// Invariants:
// - Pure: the result depends only on (logits, params, key). Randomness comes from a
//   counter-based generator keyed by (seed, sample index, position), never from state, so a
//   request gives the same tokens whatever else shares its batch and a preempted sequence
//   continues exactly where it stopped.
// - Temperature 0 is greedy: the highest logit, ties to the lowest id.
// - Log-probabilities (the chosen token's and the top entries) are log-softmax of the RAW
//   logits, before temperature, top-k and top-p. Top entries are sorted by descending
//   log-probability, ties by lower id.
#ifndef PREFIXD_ENGINE_SAMPLER_H_
#define PREFIXD_ENGINE_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/request.h"

namespace prefixd {

// Where in a request a token is drawn: `position` is the absolute position the new token
// will occupy (prompt length for the first generated token).
struct SampleKey {
  uint64_t seed = 0;
  uint32_t sample_index = 0;
  uint32_t position = 0;
};

// 64 random bits for `key`, from a splitmix64-style finaliser chained over the key's fields:
// a bijective mix per field, so distinct keys give independent-looking streams.
uint64_t CounterRandomBits(const SampleKey& key);
// Uniform in [0, 1) with 53 bits of precision.
double CounterUniform(const SampleKey& key);

struct SampledToken {
  TokenLogprob token;
  std::vector<TokenLogprob> top;  // `top_logprobs` entries (fewer only if the vocab is smaller)
};

// The maximum accepted top_logprobs (the API's bound).
inline constexpr uint32_t kMaxTopLogprobs = 20;

SampledToken SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                         const SampleKey& key, uint32_t top_logprobs);

// The tokens that top-k and top-p leave eligible at this temperature, most likely first
// (ties by lower id). Greedy returns the single argmax. Exposed so tests can check the masks.
std::vector<uint32_t> EligibleTokens(absl::Span<const float> logits, const SamplingParams& params);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_SAMPLER_H_
