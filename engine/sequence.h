// What the scheduler keeps per request and per sequence. Engine-thread only.
//
// Invariants:
// - A request has one sequence until its prompt is computed; with num_samples = n that one
//   sequence (`pre_fork`) then forks into n (sample indices 0..n-1), never before.
// - A sequence is in exactly one place: waiting (cache_seq == -1, in the waiting queue),
//   running (cache_seq is a live KvCache sequence) or finished (released, in neither).
// - chain holds prompt + emitted tokens of this sample and their block keys (one list, which
//   the KvCache grows while the sequence runs: cache/kv_cache.h invariant 6); the cache has
//   computed K/V for all of them but the last one (the next input) while decoding.
//   generated_counts counts the emitted ones (chain tokens past the prompt) by id.
#ifndef PREFIXD_ENGINE_SEQUENCE_H_
#define PREFIXD_ENGINE_SEQUENCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "cache/kv_cache.h"
#include "cache/sha256.h"
#include "cache/token_chain.h"
#include "engine/request.h"
#include "engine/request_stream.h"

namespace prefixd {

struct RequestState;
struct SequenceTiers;  // engine/kv_offloader.h

struct Sequence {
  enum class State { kWaiting, kRunning, kFinished };

  RequestState* request = nullptr;
  uint32_t sample_index = 0;
  bool pre_fork = false;  // stands for all num_samples samples until its prompt is computed
  State state = State::kWaiting;
  std::shared_ptr<TokenChain> chain;  // prompt + emitted tokens of this sample, and keys
  uint32_t generated = 0;             // emitted tokens
  // How often this sample has emitted each id (the penalties' history, engine/sampler.h).
  // Kept across preemption: it describes the chain, which a re-admission keeps.
  absl::flat_hash_map<uint32_t, uint32_t> generated_counts;
  SequenceId cache_seq = -1;
  // Order of the latest admission; the largest is preempted first. Forks share their
  // parent's and are ordered among themselves by sample index.
  int64_t admit_order = -1;
  // The next forwarded token is the sampled one (a decode), not prompt or recomputed text.
  bool decoding = false;
  // When this sample's latest token was emitted: the next one's time per output token is
  // measured from here (a preemption in between counts, as the client waited through it).
  absl::Time last_token_time;
  // The offloader's state (engine/kv_offloader.h), made by its first lookup: the load from
  // the tiers this waiting sequence is parked on (its admission then takes what arrived), and
  // each tier's latest match. Shared only so that this header needs no definition of it.
  std::shared_ptr<SequenceTiers> tiers;
};

struct RequestState {
  EngineRequest request;
  // request.tenant's id in the pool (engine/tenant_table.h), set by Scheduler::Enqueue.
  int32_t tenant_id = 0;
  // request.stop_token_ids as a set (filled by StepOutput::Prepare): checked once per
  // sampled token.
  absl::flat_hash_set<uint32_t> stop_ids;
  // The prompt's distinct ids, filled by StepOutput::Prepare only when repetition_penalty
  // is on (the one penalty that reads the prompt).
  absl::flat_hash_set<uint32_t> prompt_token_set;
  std::shared_ptr<RequestStream> stream;
  Digest root;  // CacheRootKey(manifest, namespace, adapter digest)
  absl::Time submit_time;
  bool admitted_once = false;
  bool has_first_token = false;
  bool ended = false;  // kDone queued
  uint32_t samples_finished = 0;
  Usage usage;
  // The kPrompt event is in the outbox. Its prompt logprobs, until then, are the
  // PromptScorer's (engine/prompt_scorer.h).
  bool prompt_sent = false;
  std::vector<std::unique_ptr<Sequence>> sequences;
  std::vector<RequestEvent> outbox;  // flushed to the stream at the end of each step
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_SEQUENCE_H_
