// Validation of a GenerateRequest before anything is queued. Each refusal is
// INVALID_ARGUMENT with a message that says what to change; being a function that returns a
// Status, no handler can report an error and carry on (STYLE.md 9).
#ifndef PREFIXD_SERVER_VALIDATION_H_
#define PREFIXD_SERVER_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "prefixd/v1/inference.pb.h"

namespace prefixd {

inline constexpr uint32_t kMaxTopLogprobs = 20;

struct ValidationLimits {
  uint32_t vocab_size = 0;
  uint32_t context_length = 0;
  uint32_t max_samples = 16;
  uint32_t block_size = 16;
  uint64_t pool_blocks = 0;  // the whole KV pool
};

// Blocks one sequence of prompt + max_new_tokens tokens occupies: a request that needs more
// than the whole pool could never run. (Samples of one request share their prompt blocks and
// the engine may preempt some of them, so only one sequence has to fit; this is the engine's
// own rule, engine/request_validation.h.)
uint64_t BlocksNeeded(uint64_t prompt_tokens, uint64_t max_new_tokens, uint64_t block_size);

// `prompt` is the request's token ids, or its text tokenized; the request itself tells
// whether a prompt was given at all.
absl::Status ValidateGenerateRequest(const v1::GenerateRequest& request,
                                     absl::Span<const uint32_t> prompt,
                                     const ValidationLimits& limits);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_VALIDATION_H_
