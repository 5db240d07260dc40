// The rules a request must meet, in one place with one set of messages: the engine applies
// them on Submit, so every front end refuses the same requests with the same words. Each
// refusal is INVALID_ARGUMENT with a message naming the field (by its gRPC name) and saying
// what to change; being a function that returns a Status, no caller can report an error
// and carry on.
#ifndef PREFIXD_ENGINE_REQUEST_VALIDATION_H_
#define PREFIXD_ENGINE_REQUEST_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "cache/kv_pool.h"
#include "engine/request.h"
#include "engine/model_config.h"

namespace prefixd {

// A request_id is copied into every message of its stream: it is kept short and printable.
inline constexpr size_t kMaxRequestIdBytes = 256;
// Stop ids are looked up once per sampled token.
inline constexpr size_t kMaxStopTokenIds = 1024;

struct RequestLimits {
  ModelConfig model_config;
  int32_t max_samples = 16;
  KvPoolShape pool;  // Backend::kv_pool(): a request must fit in it
  bool computes_all_logits = true;  // Backend::computes_all_logits(): prompt_logprobs allowed
  bool applies_lora = true;         // Backend::applies_lora(): adapters allowed
};

// Blocks one sequence of `tokens` tokens occupies.
inline int64_t BlocksForTokens(int64_t tokens, int32_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

// A refusal names the request field it is about (by its gRPC name, e.g. "max_new_tokens")
// in this payload, so that a front end with other names (the HTTP API's "max_tokens") can
// say which of its own fields to change.
inline constexpr char kInvalidFieldPayload[] = "type.prefixd.dev/invalid-field";
absl::Status FieldError(const std::string& field, const std::string& message);
// The field a refusal names, or "" when it names none.
std::string InvalidField(const absl::Status& status);

// OK, or INVALID_ARGUMENT with a message that says what to change (UNIMPLEMENTED for an
// adapter on a backend that cannot apply one).
absl::Status ValidateEngineRequest(const EngineRequest& request, const RequestLimits& limits);

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_REQUEST_VALIDATION_H_
