// The serving engine: one thread owns the KV pool (cache/) and the backend, and runs
// continuous batching. Callers Submit() requests and read their tokens from a thread-safe
// RequestStream; no caller thread ever touches the pool.
#ifndef PREFIXD_ENGINE_ENGINE_H_
#define PREFIXD_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cache/disk/disk_tier.h"
#include "cache/kv_cache.h"
#include "engine/backend.h"
#include "engine/model_config.h"

namespace prefixd {

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
  float repetition_penalty = 1.0f;  // > 0
  // Tokens whose probability (at this temperature) is below min_p times the most likely
  // one's are not drawn. 0 = off.
  float min_p = 0.0f;  // [0, 1]
  std::vector<TokenBias> logit_bias;  // at most 300, ids distinct and < vocab_size
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
  uint32_t completion_tokens = 0;     // all samples; stop/EOS tokens not counted
};

// What a request's stream yields, in order: with echo_prompt or prompt_logprobs one kPrompt
// first, then kToken events (any interleaving of samples), one kSampleFinished per sample,
// then exactly one kDone (status OK, or the error that ended the request: CANCELLED,
// UNAVAILABLE while shutting down, INTERNAL on a backend failure).
struct RequestEvent {
  enum class Kind { kToken, kSampleFinished, kDone, kPrompt };
  Kind kind = Kind::kToken;
  uint32_t sample_index = 0;
  TokenLogprob token;               // kToken: the token and its log-probability
  std::vector<TokenLogprob> top;    // kToken: top_logprobs entries, descending, ties by id
  FinishReason finish_reason = FinishReason::kNone;  // kSampleFinished
  Usage usage;                      // kDone
  absl::Status status;              // kDone
  std::vector<PromptToken> prompt;  // kPrompt: one entry per prompt position
};

class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // Non-blocking: appends the pending events to *out; false if there were none.
  virtual bool Poll(std::vector<RequestEvent>* out) = 0;
  // Blocks until an event is available (true) or `deadline` passes (false).
  virtual bool Wait(RequestEvent* out, absl::Time deadline = absl::InfiniteFuture()) = 0;
  // Called from the engine thread whenever events become available. It may only schedule
  // work (post to an executor or strand, raise a flag, signal a waiter): it runs inside the
  // engine's step loop, so anything slower, or any lock another thread may hold, delays the
  // next step of every request. Poll and the text work belong on the thread it schedules.
  // Set it before the first event can matter (right after Submit); it may fire at once.
  virtual void SetNotify(std::function<void()> notify) = 0;
  // Idempotent. The sequence's blocks are released before the engine's next step and the
  // stream ends with kDone(CANCELLED).
  virtual void Cancel() = 0;
  // Ends one sample as if it had met a stop condition (a stop string the caller found in its
  // text): before its next step the engine releases the sample's blocks and emits its
  // kSampleFinished(kStop); the other samples go on. Idempotent; ignored for a sample that
  // has already finished. Tokens the engine emitted before it saw the call still arrive.
  virtual void StopSample(uint32_t sample_index) = 0;
};

struct EngineOptions {
  Backend* backend = nullptr;   // not owned; used only from the engine thread
  ModelConfig model_config;
  std::string manifest_sha256;  // part of every cache block's identity
  int32_t max_batch_tokens = 512;
  int32_t max_queue = 1024;
  int32_t max_samples = 16;
  bool enable_prefix_cache = true;
  // Injected for tests (TTFT/TPOT measurements); defaults to absl::Now.
  std::function<absl::Time()> clock;
  // Called once, from the engine thread, when the backend reports a fatal device error
  // (IsFatalDeviceError, engine/backend.h). By then every request has ended with INTERNAL,
  // and Submit refuses new ones with UNAVAILABLE: the process should stop so that an
  // orchestrator restarts it.
  std::function<void(const absl::Status&)> on_fatal_error;
  // Second cache tier on local disk (cache/disk/disk_tier.h); off while disk_tier.dir is
  // empty. Cached blocks the pool evicts are written there (off the engine thread, dropped
  // when the write queue is full), admissions continue their prefix match into it, and on
  // Shutdown the blocks still cached are written within what is left of the grace, at most
  // kDiskTierShutdownSpill. Needs enable_prefix_cache. Engine::Create fails with the tier's
  // FAILED_PRECONDITION when the directory cannot be used (not writable, locked by another
  // process).
  DiskTierOptions disk_tier;
};

// The longest Shutdown spends writing cached blocks to the disk tier.
inline constexpr absl::Duration kDiskTierShutdownSpill = absl::Seconds(10);

// The scheduler's own counters (engine/scheduler.h keeps them).
struct SchedulerCounters {
  uint64_t prefill_tokens = 0;    // forwarded tokens that were not decodes of sampled tokens
  uint64_t generated_tokens = 0;  // emitted tokens (stop/EOS not counted)
  uint64_t preemptions = 0;
  uint64_t steps = 0;
  uint64_t waiting_requests = 0;  // not running (never admitted, or all preempted)
  uint64_t running_requests = 0;  // at least one sequence running
  uint64_t disk_hit_tokens = 0;   // prompt tokens of first admissions loaded from the disk tier
  // Prompt positions whose log-probability was returned (prompt length - 1 per request with
  // prompt_logprobs), and of those the ones taken from score records kept with cached blocks.
  uint64_t prompt_logprob_tokens = 0;
  uint64_t prompt_logprob_tokens_cached = 0;
};

// One snapshot, published by the engine thread after each step. Each part is its owner's
// struct, copied whole: a field added there reaches the metrics and GetCacheStats without a
// copy here that could forget it.
struct EngineStats {
  KvCacheStats cache;
  SchedulerCounters scheduler;
  DiskTierStats disk;  // all zero without a disk tier
};

// = Σ cached_prompt_tokens of first admissions: prompt tokens served from the pool plus
// those loaded from the disk tier.
inline uint64_t HitTokens(const EngineStats& s) {
  return s.cache.hit_tokens + s.scheduler.disk_hit_tokens;
}

// The disk tier layout of an engine's blocks: its manifest, the backend's kv_numerics(),
// dtype, K/V element size and block size, the model's layer and head geometry.
// INVALID_ARGUMENT when the backend's kv_bytes_per_token() is not a whole element size for
// that geometry (its blocks could not be described).
absl::StatusOr<DiskLayout> EngineDiskLayout(const EngineOptions& options);

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  virtual ~Engine() = default;

  // Validates and queues. INVALID_ARGUMENT for a request that could never run (message says
  // what to change), RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE once Shutdown began
  // or after a fatal backend error.
  virtual absl::StatusOr<std::shared_ptr<RequestStream>> Submit(EngineRequest request) = 0;

  // Refuses new requests; queued and running ones go on until `grace` ends, the rest end
  // with UNAVAILABLE. Does not wait: a later call may shorten the grace (never lengthen it).
  virtual void BeginShutdown(absl::Duration grace) = 0;
  // BeginShutdown(grace), then returns when the engine thread has stopped.
  virtual void Shutdown(absl::Duration grace) = 0;

  virtual EngineStats Stats() const = 0;

  // Latency observations (seconds) since the last call, for histograms: time to first token
  // and time per output token.
  struct Latencies {
    std::vector<double> ttft;
    std::vector<double> tpot;
    std::vector<double> disk_load;  // per block read from the disk tier (read, verify, upload)
  };
  // Observations waiting for DrainLatencies are bounded: with nobody draining (no metrics
  // scrape) a long-running server would otherwise grow by 8 bytes per token. Past this many
  // of a kind, the oldest are dropped down to half as many (a scraper that comes back late
  // sees the latest).
  static constexpr size_t kMaxPendingLatencies = size_t{1} << 20;
  virtual Latencies DrainLatencies() = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_ENGINE_H_
