// What a caller asks the engine for (EngineRequest) and what a request's stream yields
// (RequestEvent). Plain values, shared by the engine, the front ends and the tests.
#ifndef PREFIXD_ENGINE_REQUEST_H_
#define PREFIXD_ENGINE_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace prefixd {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  uint32_t top_k = 0;        // 0 = off
  float top_p = 1.0f;        // (0, 1]
  uint64_t seed = 0;         // the server picks one when the client gives none
};

struct EngineRequest {
  std::string request_id;
  std::vector<uint32_t> prompt;
  // Opaque cache namespace, derived by the caller from the authenticated tenant and the
  // request's cache salt. Requests in different namespaces never share a block.
  std::string cache_namespace;
  uint32_t max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<uint32_t> stop_token_ids;
  bool ignore_eos = false;
  uint32_t num_samples = 1;
  uint32_t top_logprobs = 0;  // 0..20
};

enum class FinishReason { kNone, kLength, kStop };

struct TokenLogprob {
  uint32_t token_id = 0;
  float logprob = 0.0f;
};

struct Usage {
  uint32_t prompt_tokens = 0;
  uint32_t cached_prompt_tokens = 0;  // min(matched prefix, prompt - 1) at first admission
  uint32_t completion_tokens = 0;     // all samples; stop/EOS tokens not counted
};

// What a request's stream yields, in order: kToken events (any interleaving of samples),
// one kSampleFinished per sample, then exactly one kDone (status OK, or the error that ended
// the request: CANCELLED, UNAVAILABLE while shutting down, INTERNAL on a backend failure).
struct RequestEvent {
  enum class Kind { kToken, kSampleFinished, kDone };
  Kind kind = Kind::kToken;
  uint32_t sample_index = 0;
  TokenLogprob token;               // kToken: the token and its log-probability
  std::vector<TokenLogprob> top;    // kToken: top_logprobs entries, descending, ties by id
  FinishReason finish_reason = FinishReason::kNone;  // kSampleFinished
  Usage usage;                      // kDone
  absl::Status status;              // kDone
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_REQUEST_H_
