#include "server/validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace prefixd {

uint64_t BlocksNeeded(uint64_t prompt_tokens, uint64_t max_new_tokens, uint64_t block_size) {
  return (prompt_tokens + max_new_tokens + block_size - 1) / block_size;
}

absl::Status ValidateGenerateRequest(const v1::GenerateRequest& request,
                                     absl::Span<const uint32_t> prompt,
                                     const ValidationLimits& limits) {
  using absl::InvalidArgumentError;
  using absl::StrCat;
  if (request.prompt_case() == v1::GenerateRequest::PROMPT_NOT_SET) {
    return InvalidArgumentError("no prompt: set `text` or `token_ids`");
  }
  if (prompt.empty()) {
    return InvalidArgumentError(request.prompt_case() == v1::GenerateRequest::kText
                                    ? "empty prompt: `text` must produce at least one token"
                                    : "empty prompt: `token_ids.ids` must hold at least one id");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= limits.vocab_size) {
      return InvalidArgumentError(StrCat("prompt token id ", prompt[i], " at position ", i,
                                         " is out of range: ids must be < vocab_size ",
                                         limits.vocab_size));
    }
  }
  if (request.max_new_tokens() == 0) {
    return InvalidArgumentError("max_new_tokens is 0: ask for at least 1 token");
  }
  const uint64_t total = static_cast<uint64_t>(prompt.size()) + request.max_new_tokens();
  if (total > limits.context_length) {
    return InvalidArgumentError(
        StrCat("prompt (", prompt.size(), " tokens) + max_new_tokens (", request.max_new_tokens(),
               ") = ", total, " exceeds the model's context length ", limits.context_length,
               ": shorten the prompt or lower max_new_tokens"));
  }
  const uint32_t samples = request.num_samples() == 0 ? 1 : request.num_samples();
  if (samples > limits.max_samples) {
    return InvalidArgumentError(StrCat("num_samples ", samples, " exceeds this server's limit ",
                                       limits.max_samples, " (--max-samples)"));
  }
  if (!std::isfinite(request.temperature()) || request.temperature() < 0) {
    return InvalidArgumentError(StrCat("temperature ", request.temperature(),
                                       " is invalid: use a finite value >= 0 (0 = greedy)"));
  }
  if (request.has_top_p() &&
      (!std::isfinite(request.top_p()) || request.top_p() <= 0 || request.top_p() > 1)) {
    return InvalidArgumentError(
        StrCat("top_p ", request.top_p(), " is invalid: use a value in (0, 1], or leave it unset"));
  }
  if (request.top_logprobs() > kMaxTopLogprobs) {
    return InvalidArgumentError(
        StrCat("top_logprobs ", request.top_logprobs(), " is too large: use 0..", kMaxTopLogprobs));
  }
  for (uint32_t id : request.stop_token_ids()) {
    if (id >= limits.vocab_size) {
      return InvalidArgumentError(StrCat(
          "stop token id ", id, " is out of range: ids must be < vocab_size ", limits.vocab_size));
    }
  }
  const uint64_t blocks = BlocksNeeded(prompt.size(), request.max_new_tokens(), limits.block_size);
  if (blocks > limits.pool_blocks) {
    return InvalidArgumentError(
        StrCat("the request needs ", blocks, " KV blocks (", prompt.size(), " prompt tokens + ",
               request.max_new_tokens(), " new tokens, ", limits.block_size,
               " tokens per block) but the whole pool holds ", limits.pool_blocks, " blocks (",
               limits.pool_blocks * limits.block_size,
               " tokens): shorten the prompt or lower max_new_tokens"));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
