// Every rule a request must meet, in one place with one set of messages: the engine applies
// ValidateEngineRequest on Submit, and the request path (server/request_path.h) applies the
// rules on what only a front end holds (a prompt's text before it is tokenized, stop strings)
// from here too, so every front end refuses the same requests for the same reasons. A new
// request field's rule goes here, once.
//
// A refusal is INVALID_ARGUMENT (UNIMPLEMENTED for what the backend cannot do) carrying the
// field it concerns (ErrorField). Its message says what is wrong and what to change but does
// not name the field: it is written to follow the field's name, which each front end puts
// first in its own vocabulary ("max_new_tokens is 0: ..." over gRPC, "max_tokens is 0: ..."
// over HTTP). Being functions that return a Status, no caller can report an error and carry
// on.
#ifndef PREFIXD_ENGINE_REQUEST_VALIDATION_H_
#define PREFIXD_ENGINE_REQUEST_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/kv_pool.h"
#include "engine/model_config.h"
#include "engine/request.h"

namespace prefixd {

// A request_id is copied into every message of its stream: it is kept short and printable.
inline constexpr size_t kMaxRequestIdBytes = 256;
// Stop ids are looked up once per sampled token.
inline constexpr size_t kMaxStopTokenIds = 1024;
// Stop strings are matched against every sample's text as it grows: a few short ones.
inline constexpr size_t kMaxStopStrings = 4;
inline constexpr size_t kMaxStopStringBytes = 64;

struct RequestLimits {
  ModelConfig model_config;
  int32_t max_samples = 16;
  KvPoolShape pool;                 // Backend::kv_pool(): a request must fit in it
  bool computes_all_logits = true;  // Backend::computes_all_logits(): prompt_logprobs allowed
  bool applies_lora = true;         // Backend::applies_lora(): adapters allowed
};

// Blocks one sequence of `tokens` tokens occupies.
inline int64_t BlocksForTokens(int64_t tokens, int32_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

// INVALID_ARGUMENT with `message` (written to follow the field's name), carrying `field`.
absl::Status FieldError(RequestField field, const std::string& message);
// `status` carrying `field` (a refusal of another code about one field, e.g. NOT_FOUND for
// an adapter's name). OK stays OK.
absl::Status WithField(absl::Status status, RequestField field);
// The field a refusal carries; kNone when it carries none.
RequestField ErrorField(const absl::Status& status);

// The longest retention a request may ask for: OpenAI's "24h".
inline constexpr absl::Duration kMaxCacheRetention = absl::Hours(24);
// OpenAI's prompt_cache_retention values: "" or "in_memory" (zero: today's cache), "24h".
// INVALID_ARGUMENT on kCacheRetention for any other value.
absl::StatusOr<absl::Duration> ParseCacheRetention(std::string_view value);

// OK, or the refusal of the first rule the request breaks.
absl::Status ValidateEngineRequest(const EngineRequest& request, const RequestLimits& limits);

// The longest prompt text worth tokenizing: context × the longest token's bytes. A longer
// text has more tokens than the context holds.
size_t MaxPromptTextBytes(int32_t context_length, size_t max_token_bytes);
// A prompt's text before it is tokenized (so that an oversized one costs no tokenizing):
// at most MaxPromptTextBytes (kPrompt).
absl::Status ValidatePromptText(std::string_view text, int32_t context_length,
                                size_t max_token_bytes);
// Stop strings: at most kMaxStopStrings, each 1 to kMaxStopStringBytes bytes (kStop).
absl::Status ValidateStopStrings(const std::vector<std::string>& stop);
// Token ids of `field` below `vocab_size` (the prompt, stop ids; also ids to detokenize).
absl::Status ValidateTokenIds(absl::Span<const uint32_t> ids, int32_t vocab_size,
                              RequestField field);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_REQUEST_VALIDATION_H_
