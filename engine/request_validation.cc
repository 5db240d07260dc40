#include "engine/request_validation.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "engine/sampler.h"

namespace prefixd {

absl::Status ValidateEngineRequest(const EngineRequest& r, const RequestLimits& limits) {
  const ModelConfig& config = limits.model_config;
  const uint32_t vocab = static_cast<uint32_t>(config.vocab_size);
  if (r.prompt.empty()) {
    return absl::InvalidArgumentError("prompt is empty: give at least one token");
  }
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prompt token %d at index %d is out of range: token ids must be below the vocabulary "
          "size %d",
          r.prompt[i], i, vocab));
    }
  }
  if (r.max_new_tokens == 0) {
    return absl::InvalidArgumentError("max_new_tokens is 0: ask for at least one token");
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  if (total > config.n_positions) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt (%d tokens) + max_new_tokens (%d) = %d exceeds the model's context length of "
        "%d tokens: shorten the prompt or lower max_new_tokens",
        r.prompt.size(), r.max_new_tokens, total, config.n_positions));
  }
  if (r.num_samples == 0 || static_cast<int64_t>(r.num_samples) > limits.max_samples) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_samples is %d: it must be between 1 and %d", r.num_samples, limits.max_samples));
  }
  const SamplingParams& s = r.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "temperature %g is invalid: use 0 (greedy) or a finite positive value", s.temperature));
  }
  if (!std::isfinite(s.top_p) || !(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_p %g is invalid: it must be in (0, 1]", s.top_p));
  }
  if (r.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrFormat("top_logprobs is %d: at most %d are returned",
                                                      r.top_logprobs, kMaxTopLogprobs));
  }
  for (uint32_t id : r.stop_token_ids) {
    if (id >= vocab) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stop token id %d is out of range: token ids must be below the vocabulary size %d", id,
          vocab));
    }
  }
  const int64_t blocks = BlocksForTokens(total, limits.block_size);
  if (blocks > limits.pool_blocks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt (%d tokens) + max_new_tokens (%d) needs %d KV blocks of %d tokens, but the KV "
        "pool holds only %d blocks (%d tokens): shorten the prompt, lower max_new_tokens, or "
        "start the server with a larger --kv-cache-bytes",
        r.prompt.size(), r.max_new_tokens, blocks, limits.block_size, limits.pool_blocks,
        limits.pool_blocks * limits.block_size));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
