// The step-output stage: what a forward pass's logits become for a sequence at the end of its
// tokens. The scheduler decides what runs; this stage, given a sequence and its logits row,
// emits the prompt (engine/prompt_scorer.h gives its logprobs), forks a prompt with
// num_samples = n into n samples, samples each one's next token (engine/sampler.h), appends
// it, builds the request's events and detects the end of each sample (EOS, a stop id,
// max_new_tokens). It also prepares what sampling reads of a new request and ends requests
// for the scheduler (errors, cancellations).
//
// The scheduler calls it per batch entry, right after that entry's blocks were marked
// computed, not once after the whole batch: a sample that ends here releases blocks that a
// later entry's MarkComputed may share (an identical block of a sibling sample), so the
// pool's state, and with it every later block id, depends on that order.
//
// Invariants: every event goes to its request's outbox in the order of the calls; a request
// gets exactly one kDone, after one kSampleFinished per sample (or an error); a finished
// sample holds no KvCache sequence and no tier load. Sampling is keyed by (seed, sample
// index, position), so a sample's tokens do not depend on which others share its step.
// Engine-thread only.
#ifndef PREFIXD_ENGINE_STEP_OUTPUT_H_
#define PREFIXD_ENGINE_STEP_OUTPUT_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/kv_cache.h"
#include "engine/engine_stats.h"
#include "engine/prompt_scorer.h"
#include "engine/request.h"
#include "engine/sequence.h"

namespace prefixd {

struct SampledToken;  // engine/sampler.h

class StepOutput {
 public:
  struct Options {
    KvCache* cache = nullptr;        // not owned: forks, appended tokens, releases
    PromptScorer* scorer = nullptr;  // not owned: the prompt logprobs
    uint32_t eos_token_id = 0;
    std::function<absl::Time()> clock;  // required
    // Not owned (the scheduler's): generated_tokens and prompt_logprob_tokens(_cached) are
    // counted here, and the time to first token and per output token observed.
    SchedulerCounters* counters = nullptr;
    std::vector<double>* ttft = nullptr;
    std::vector<double>* tpot = nullptr;
  };
  explicit StepOutput(const Options& options);

  // Fills what sampling reads of a request that was just enqueued: its stop ids as a set
  // and, only with repetition_penalty on, its prompt's distinct ids.
  void Prepare(RequestState* request) const;

  // `seq` reached the end of its tokens and `logits` is the row of its last one: emits the
  // prompt when the request asked for it and has not had it (with max_new_tokens = 0 that
  // ends the request), else samples the next token of `seq` and, when `seq` stands for n
  // samples, of each fork; the forks are appended to `forked`.
  void Emit(Sequence* seq, absl::Span<const float> logits, absl::Time now,
            std::vector<Sequence*>* forked);
  // Ends one sample with `reason`, releasing its blocks; the request's kDone follows its
  // last sample's. `stop_token`: the stop token that ended it, carried by its
  // kSampleFinished (RequestEvent::has_stop_token); null for any other end.
  void FinishSequence(Sequence* seq, FinishReason reason, const SampledToken* stop_token = nullptr);
  // Ends `request` with `status` (non-OK), releasing every sequence it still holds.
  void EndRequest(RequestState* request, const absl::Status& status);

 private:
  void EmitPrompt(Sequence* seq);
  void SampleAndEmit(Sequence* seq, absl::Span<const float> logits, absl::Time now,
                     std::vector<Sequence*>* forked);
  void ReleaseSequence(Sequence* seq);

  const Options options_;
};

}  // namespace prefixd

#endif  // PREFIXD_ENGINE_STEP_OUTPUT_H_
