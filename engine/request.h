// What a caller asks the engine for (EngineRequest) and what a request's stream yields
// (RequestEvent). Plain values, shared by the engine, the front ends and the tests.
#ifndef PREFIXD_ENGINE_REQUEST_H_
#define PREFIXD_ENGINE_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace prefixd {

struct LoraAdapter;  // engine/lora_adapter.h

// A bias added to one token's logit before sampling (OpenAI's `logit_bias`).
struct TokenBias {
  uint32_t token_id = 0;
  float bias = 0.0f;  // [-100, 100]
  friend bool operator==(const TokenBias&, const TokenBias&) = default;
};

// How a token is drawn. The logit processing (engine/sampler.h) runs in vLLM's order:
// logit_bias, then repetition_penalty, then frequency and presence penalties, then
// temperature, min_p, top-k and top-p.
struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  uint32_t top_k = 0;        // 0 = off
  float top_p = 1.0f;        // (0, 1]
  uint64_t seed = 0;         // the server picks one when the client gives none
  // OpenAI's definitions, over the sample's generated tokens only: a token generated c
  // times has its logit lowered by c * frequency_penalty + (c > 0) * presence_penalty.
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  // vLLM's and Hugging Face's definition, over the prompt's and the generated tokens: a
  // token that occurs in either has a positive logit divided by it, a negative one
  // multiplied by it. 1 = off.
  float repetition_penalty = 1.0f;  // [kMinRepetitionPenalty, kMaxRepetitionPenalty]
  // Tokens whose probability (at this temperature) is below min_p times the most likely
  // one's are not drawn. 0 = off.
  float min_p = 0.0f;                 // [0, 1]
  std::vector<TokenBias> logit_bias;  // at most 300, ids distinct and < vocab_size
};

// The fields of a request, as the engine's rules name them (engine/request_validation.h): a
// refusal carries the field it concerns, and each front end names it in its own vocabulary
// (GenerateRequest's proto fields for gRPC, OpenAI's JSON names for HTTP). A new request
// field gets a value here, its member below, its rule in request_validation.cc and its name
// in each front end's parser.
enum class RequestField {
  kNone = 0,
  kRequestId,
  kPrompt,  // the prompt, as text or as token ids
  kMaxNewTokens,
  kTemperature,
  kTopK,
  kTopP,
  kSeed,
  kPresencePenalty,
  kFrequencyPenalty,
  kRepetitionPenalty,
  kMinP,
  kLogitBias,
  kStopTokenIds,
  kIgnoreEos,
  kNumSamples,
  kTopLogprobs,
  kEchoPrompt,
  kPromptLogprobs,
  kAdapter,  // the adapter's name, resolved by the front end's request path
  // What only the front ends hold (server/request_path.h GenerateCall), checked by the same
  // rules.
  kStop,
  kCacheSalt,
  kCacheRetention,  // prompt_cache_retention: a wire value the request path reads
};

struct EngineRequest {
  std::string request_id;
  std::vector<uint32_t> prompt;
  // Opaque cache namespace, derived by the caller from the authenticated tenant and the
  // request's cache salt. Requests in different namespaces never share a block.
  std::string cache_namespace;
  // The authenticated tenant's name, set by the caller like the namespace: whose admission
  // share, cache share and waiting cap (engine/tenant_policy.h) the request counts against.
  std::string tenant;
  // Prompt cache retention (OpenAI's prompt_cache_retention): zero keeps today's behaviour
  // ("in_memory"); otherwise the prompt's full blocks stay resident for this long after
  // their last use, evicted only after every other block (cache/eviction_queue.h). At most
  // kMaxCacheRetention; the engine caps it further at EngineOptions::max_cache_retention.
  absl::Duration cache_retention = absl::ZeroDuration();
  // The LoRA adapter to apply (null: the base model). Its digest enters the request's cache
  // root key (cache/block_key.h), so it never shares a block with the base or another
  // adapter. Held by the request until its stream ends, so unloading an adapter's name lets
  // the requests in flight finish with it.
  std::shared_ptr<const LoraAdapter> adapter;
  // The name the caller served the adapter under (empty for the base). The engine only
  // counts the request's prompt tokens under it (Engine::DrainAdapterTokens); the digest,
  // not the name, keys the cache.
  std::string adapter_name;
  uint32_t max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<uint32_t> stop_token_ids;
  bool ignore_eos = false;
  uint32_t num_samples = 1;
  uint32_t top_logprobs = 0;  // 0..20
  // The prompt comes back first, in one kPrompt event before any token: its ids, and with
  // prompt_logprobs each position's log-probability given the positions before it and that
  // many top entries (0..20). Only requests with prompt_logprobs compute the logits of every
  // prompt position. With either, max_new_tokens may be 0 (the prompt alone).
  bool echo_prompt = false;
  std::optional<uint32_t> prompt_logprobs;
};

enum class FinishReason { kNone, kLength, kStop };

struct TokenLogprob {
  uint32_t token_id = 0;
  float logprob = 0.0f;
  friend bool operator==(const TokenLogprob&, const TokenLogprob&) = default;
};

// One prompt position of a kPrompt event. Position 0 has no log-probability (nothing comes
// before it); neither has any position without prompt_logprobs.
struct PromptToken {
  uint32_t token_id = 0;
  bool has_logprob = false;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // prompt_logprobs entries, descending, ties by lower id
  friend bool operator==(const PromptToken&, const PromptToken&) = default;
};

struct Usage {
  uint32_t prompt_tokens = 0;
  uint32_t cached_prompt_tokens = 0;  // min(matched prefix, prompt - 1) at first admission
  // Where they came from: of cached_prompt_tokens, these were loaded from the disk tier and
  // from the remote tier; the rest (cached_prompt_tokens - both) were the pool's.
  uint32_t cached_disk_tokens = 0;
  uint32_t cached_remote_tokens = 0;
  // Of cached_prompt_tokens, those read from blocks a retention kept (prompt_cache_retention).
  uint32_t cached_retained_tokens = 0;
  uint32_t completion_tokens = 0;  // all samples; stop/EOS tokens not counted
};

// What a request's stream yields, in order: with echo_prompt or prompt_logprobs one kPrompt
// first, then kToken events (any interleaving of samples), one kSampleFinished per sample,
// then exactly one kDone (status OK, or the error that ended the request: CANCELLED,
// UNAVAILABLE while shutting down, INTERNAL on a backend failure).
struct RequestEvent {
  enum class Kind { kToken, kSampleFinished, kDone, kPrompt };
  Kind kind = Kind::kToken;
  uint32_t sample_index = 0;
  TokenLogprob token;             // kToken: the token and its log-probability
  std::vector<TokenLogprob> top;  // kToken: top_logprobs entries, descending, ties by id
  FinishReason finish_reason = FinishReason::kNone;  // kSampleFinished
  // kSampleFinished by a stop token (EOS or a stop_token_ids id): that token is in `token`
  // and `top`. It is never a kToken and never counted (Usage), but OpenAI's API lists it
  // in a choice's logprobs, and lm-evaluation-harness reads the entry after an echoed
  // prompt as the one generated token.
  bool has_stop_token = false;
  Usage usage;                                       // kDone
  absl::Status status;                               // kDone
  std::vector<PromptToken> prompt;                   // kPrompt: one entry per prompt position
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_REQUEST_H_
