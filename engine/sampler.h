// Token sampling from one row of logits.
//
// Invariants:
// - Pure: the result depends only on (logits, params, key). Randomness comes from a
//   counter-based generator keyed by (seed, sample index, position), never from state, so a
//   request gives the same tokens whatever else shares its batch and a preempted sequence
//   continues exactly where it stopped.
// - Temperature 0 is greedy: the highest logit, ties to the lowest id.
// - Log-probabilities (the chosen token's and the top entries) are log-softmax of the RAW
//   logits, before logit_bias, penalties, temperature, min_p, top-k and top-p (vLLM's
//   default). Top entries are sorted by descending log-probability, ties by lower id.
// - The draw is from the processed logits: logit_bias, then repetition_penalty, then the
//   frequency and presence penalties (each one applied per token id, so the result does not
//   depend on the order in which the history's containers are visited), then temperature,
//   min_p, top-k, top-p. The history a sample has (its prompt's ids, its generated ids'
//   counts) is part of its input, so the result stays a pure function of the request.
#ifndef PREFIXD_ENGINE_SAMPLER_H_
#define PREFIXD_ENGINE_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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

// What the penalties read of a sample's past. A null member is read as empty; the engine
// fills only what the request's penalties need.
struct SampleHistory {
  // The prompt's distinct ids (repetition_penalty).
  const absl::flat_hash_set<uint32_t>* prompt_tokens = nullptr;
  // How often the sample has generated each id (every penalty).
  const absl::flat_hash_map<uint32_t, uint32_t>* generated_counts = nullptr;
};

// The most logit_bias entries a request may give (OpenAI's limit) and their range.
inline constexpr size_t kMaxLogitBias = 300;
inline constexpr float kMaxAbsLogitBias = 100.0f;
// OpenAI's range for presence_penalty and frequency_penalty.
inline constexpr float kMaxAbsPenalty = 2.0f;
// The repetition_penalty range. A penalty divides positive logits and multiplies negative
// ones, so it scales a logit by at most 100: a model's logits (tens) stay far inside float's
// range, where 1e-40 (a denormal) turned them into +Inf and the draw uniform. Hugging Face
// and llama.cpp use 1.0 to about 1.5.
inline constexpr float kMinRepetitionPenalty = 0.01f;
inline constexpr float kMaxRepetitionPenalty = 100.0f;

// Whether `params` change the logits before the draw (a bias or a penalty that is not off).
bool ProcessesLogits(const SamplingParams& params);
// *out = `logits` after logit_bias and the penalties: for each id, l += bias; then, if the id
// is in the prompt or generated, l = l > 0 ? l / repetition_penalty : l * repetition_penalty;
// then l -= count * frequency_penalty; then, if count > 0, l -= presence_penalty (fp32, in
// that order).
void ProcessLogits(absl::Span<const float> logits, const SamplingParams& params,
                   const SampleHistory& history, std::vector<float>* out);

SampledToken SampleToken(absl::Span<const float> logits, const SamplingParams& params,
                         const SampleKey& key, uint32_t top_logprobs,
                         const SampleHistory& history = {});

// How `token` scores under `logits`: its log-probability and the `top_n` most likely
// entries, the same bits SampleToken reports for a drawn token (log-softmax of the raw
// logits). Prompt logprobs are made of these.
SampledToken ScoreToken(absl::Span<const float> logits, uint32_t token, uint32_t top_n);

// The tokens that min_p, top-k and top-p leave eligible at this temperature, most likely
// first (ties by lower id), for logits already processed (ProcessLogits). Greedy returns the
// single argmax. Exposed so tests can check the masks.
std::vector<uint32_t> EligibleTokens(absl::Span<const float> logits, const SamplingParams& params);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_SAMPLER_H_
