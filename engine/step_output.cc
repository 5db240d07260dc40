#include "engine/step_output.h"

#include <memory>
#include <utility>

#include "base/check.h"
#include "engine/sampler.h"

namespace prefixd {

StepOutput::StepOutput(const Options& options) : options_(options) {
  PREFIXD_CHECK(options_.cache != nullptr && options_.scorer != nullptr && options_.clock);
  PREFIXD_CHECK(options_.counters != nullptr && options_.ttft != nullptr &&
                options_.tpot != nullptr);
}

void StepOutput::Prepare(RequestState* r) const {
  const std::vector<uint32_t>& stops = r->request.stop_token_ids;
  r->stop_ids.insert(stops.begin(), stops.end());
  if (r->request.sampling.repetition_penalty != 1.0f) {
    const std::vector<uint32_t>& prompt = r->request.prompt;
    r->prompt_token_set.insert(prompt.begin(), prompt.end());
  }
}

void StepOutput::Emit(Sequence* seq, absl::Span<const float> logits, absl::Time now,
                      std::vector<Sequence*>* forked) {
  RequestState* r = seq->request;
  const bool echo = r->request.echo_prompt || r->request.prompt_logprobs.has_value();
  if (echo && !r->prompt_sent) {
    EmitPrompt(seq);
    if (r->request.max_new_tokens == 0) return;  // EmitPrompt ended the request
  }
  SampleAndEmit(seq, logits, now, forked);
}

void StepOutput::SampleAndEmit(Sequence* seq, absl::Span<const float> logits, absl::Time now,
                               std::vector<Sequence*>* forked) {
  RequestState* r = seq->request;
  const EngineRequest& req = r->request;
  std::vector<Sequence*> samples = {seq};
  if (seq->pre_fork) {
    // The prompt is computed once; each sample continues from a copy-on-write fork.
    seq->pre_fork = false;
    // Each sample's chain starts as a copy of the prompt's, keys included.
    std::vector<std::shared_ptr<TokenChain>> chains(req.num_samples - 1);
    for (auto& c : chains) c = std::make_shared<TokenChain>(*seq->chain);
    const std::vector<SequenceId> children = options_.cache->Fork(seq->cache_seq, chains);
    for (size_t i = 0; i < children.size(); ++i) {
      auto child = std::make_unique<Sequence>();
      child->request = r;
      child->sample_index = static_cast<uint32_t>(i + 1);
      child->state = Sequence::State::kRunning;
      child->chain = chains[i];
      child->generated_counts = seq->generated_counts;
      child->cache_seq = children[i];
      child->admit_order = seq->admit_order;
      forked->push_back(child.get());
      samples.push_back(child.get());
      r->sequences.push_back(std::move(child));
    }
  }
  for (Sequence* s : samples) {
    const SampleKey key{.seed = req.sampling.seed,
                        .sample_index = s->sample_index,
                        .position = static_cast<uint32_t>(s->chain->size())};
    const SampleHistory history{.prompt_tokens = &r->prompt_token_set,
                                .generated_counts = &s->generated_counts};
    SampledToken t = SampleToken(logits, req.sampling, key, req.top_logprobs, history);
    const uint32_t id = t.token.token_id;
    const bool is_stop =
        (!req.ignore_eos && id == options_.eos_token_id) || r->stop_ids.contains(id);
    if (is_stop) {
      FinishSequence(s, FinishReason::kStop, &t);
      continue;
    }
    RequestEvent event;
    event.kind = RequestEvent::Kind::kToken;
    event.sample_index = s->sample_index;
    event.token = t.token;
    event.top = std::move(t.top);
    r->outbox.push_back(std::move(event));
    ++s->generated;
    ++s->generated_counts[id];
    ++r->usage.completion_tokens;
    ++options_.counters->generated_tokens;
    if (!r->has_first_token) {
      r->has_first_token = true;
      options_.ttft->push_back(absl::ToDoubleSeconds(now - r->submit_time));
    }
    // Time per output token: one observation per token after the sample's first, the time
    // since that sample's previous token (also for samples that end early).
    if (s->generated >= 2) {
      options_.tpot->push_back(absl::ToDoubleSeconds(now - s->last_token_time));
    }
    s->last_token_time = now;
    if (s->generated == req.max_new_tokens) {
      FinishSequence(s, FinishReason::kLength);
      continue;
    }
    options_.cache->AppendTokens(s->cache_seq, {id});  // onto s->chain: the one list of its tokens
    s->decoding = true;
  }
}

void StepOutput::EmitPrompt(Sequence* seq) {
  RequestState* r = seq->request;
  const EngineRequest& req = r->request;
  RequestEvent event;
  event.kind = RequestEvent::Kind::kPrompt;
  if (req.prompt_logprobs.has_value()) {
    PromptScorer::Scores scores = options_.scorer->Finish(r, *req.prompt_logprobs);
    event.prompt = std::move(scores.positions);
    options_.counters->prompt_logprob_tokens += req.prompt.size() - 1;
    options_.counters->prompt_logprob_tokens_cached += scores.cached;
  } else {
    event.prompt.resize(req.prompt.size());
    for (size_t p = 0; p < req.prompt.size(); ++p) event.prompt[p].token_id = req.prompt[p];
  }
  r->outbox.push_back(std::move(event));
  r->prompt_sent = true;
  if (req.max_new_tokens > 0) return;
  // The prompt alone: every sample ends here, with nothing generated.
  PREFIXD_CHECK(seq->sample_index == 0);
  seq->pre_fork = false;
  for (uint32_t i = 1; i < req.num_samples; ++i) {
    RequestEvent finished;
    finished.kind = RequestEvent::Kind::kSampleFinished;
    finished.sample_index = i;
    finished.finish_reason = FinishReason::kLength;
    r->outbox.push_back(std::move(finished));
    ++r->samples_finished;
  }
  if (!r->has_first_token) {
    r->has_first_token = true;
    options_.ttft->push_back(absl::ToDoubleSeconds(options_.clock() - r->submit_time));
  }
  FinishSequence(seq, FinishReason::kLength);
}

void StepOutput::FinishSequence(Sequence* seq, FinishReason reason,
                                const SampledToken* stop_token) {
  RequestState* r = seq->request;
  ReleaseSequence(seq);
  RequestEvent event;
  event.kind = RequestEvent::Kind::kSampleFinished;
  event.sample_index = seq->sample_index;
  event.finish_reason = reason;
  if (stop_token != nullptr) {
    event.has_stop_token = true;
    event.token = stop_token->token;
    event.top = stop_token->top;
  }
  r->outbox.push_back(std::move(event));
  if (++r->samples_finished == r->request.num_samples) {
    RequestEvent done;
    done.kind = RequestEvent::Kind::kDone;
    done.usage = r->usage;
    done.status = absl::OkStatus();
    r->outbox.push_back(std::move(done));
    r->ended = true;
  }
}

void StepOutput::EndRequest(RequestState* r, const absl::Status& status) {
  PREFIXD_CHECK(!r->ended && !status.ok());
  for (auto& seq : r->sequences) {
    if (seq->state != Sequence::State::kFinished) ReleaseSequence(seq.get());
  }
  RequestEvent done;
  done.kind = RequestEvent::Kind::kDone;
  done.usage = r->usage;
  done.status = status;
  r->outbox.push_back(std::move(done));
  r->ended = true;
}

void StepOutput::ReleaseSequence(Sequence* seq) {
  if (seq->state == Sequence::State::kRunning) options_.cache->Release(seq->cache_seq);
  seq->cache_seq = -1;
  seq->state = Sequence::State::kFinished;
  // A waiting sample may be parked on a load: its tier's fetch budget and the bytes read
  // come back now, not when the request's other samples end.
  seq->tiers.reset();
}

}  // namespace prefixd
