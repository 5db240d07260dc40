#include "server/generate_output.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "base/check.h"

namespace prefixd {

GenerateOutput::GenerateOutput(const Tokenizer& tokenizer, uint32_t num_samples,
                               std::vector<std::string> stop_strings)
    : tokenizer_(tokenizer), stops_(std::move(stop_strings)), samples_(num_samples) {}

void GenerateOutput::Add(std::vector<RequestEvent> events) {
  for (RequestEvent& e : events) {
    PREFIXD_CHECK(!done_event_);
    switch (e.kind) {
      case RequestEvent::Kind::kToken:
        PREFIXD_CHECK(e.sample_index < samples_.size());
        AddToken(samples_[e.sample_index], e);
        break;
      case RequestEvent::Kind::kSampleFinished: {
        PREFIXD_CHECK(e.sample_index < samples_.size());
        Sample& s = samples_[e.sample_index];
        // A stop string that ended the sample first cut everything after it.
        if (e.has_stop_token && s.finish == FinishReason::kNone) {
          OutputToken& t = s.stop_token.emplace();
          t.token_id = e.token.token_id;
          t.logprob = e.token.logprob;
          t.top = std::move(e.top);
        }
        EndSample(s, e.sample_index, e.finish_reason);
        break;
      }
      case RequestEvent::Kind::kPrompt:
        has_prompt_ = true;
        prompt_ = std::move(e.prompt);
        break;
      case RequestEvent::Kind::kDone:
        done_event_ = true;
        status_ = e.status;
        usage_ = e.usage;
        break;
    }
  }
}

bool GenerateOutput::TakePrompt(std::vector<PromptToken>* out) {
  if (!has_prompt_) return false;
  has_prompt_ = false;
  *out = std::move(prompt_);
  prompt_.clear();
  return true;
}

void GenerateOutput::AddToken(Sample& s, const RequestEvent& e) {
  const uint32_t index = static_cast<uint32_t>(&s - samples_.data());
  if (s.finish != FinishReason::kNone) return;  // after a stop string: never sent
  s.text += s.decoder.Push(tokenizer_.TokenBytes(e.token.token_id));
  Pending p;
  p.token.token_id = e.token.token_id;
  p.token.logprob = e.token.logprob;
  p.token.top = e.top;
  p.text_end = s.text.size();
  s.held.push_back(std::move(p));
  Release(s, index, /*at_end=*/false);
}

void GenerateOutput::EndSample(Sample& s, uint32_t index, FinishReason reason) {
  if (s.finish != FinishReason::kNone) return;  // a stop string ended it first
  const std::string rest = s.decoder.Flush();
  if (!rest.empty()) {
    s.text += rest;
    if (!s.held.empty()) {
      s.held.back().text_end = s.text.size();
    }
  }
  s.finish = reason;
  Release(s, index, /*at_end=*/true);
}

void GenerateOutput::Release(Sample& s, uint32_t index, bool at_end) {
  // The stop string that ends first in the text not yet handed out (at the same end, the
  // longer): the one a reader of the text character by character meets first, so the cut
  // depends on the text alone, not on how tokens split it ("bc" within "abcd" ends first
  // whether "abcd" came as one token or as "ab", "c", "d"). None can start before `sent`: a
  // complete one would have matched earlier, and the start of one is held.
  size_t stop_at = std::string::npos;
  size_t stop_end = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t k = s.text.find(stop, s.sent);
    if (k == std::string::npos) continue;
    const size_t end = k + stop.size();
    if (end < stop_end || (end == stop_end && k < stop_at)) {
      stop_at = k;
      stop_end = end;
    }
  }
  size_t safe = s.text.size();
  if (stop_at != std::string::npos) {
    safe = stop_at;
  } else if (!at_end) {
    // Hold back the longest end of the text that could begin a stop string.
    size_t hold = 0;
    for (const std::string& stop : stops_) {
      for (size_t len = std::min(stop.size() - 1, s.text.size() - s.sent); len > hold; --len) {
        if (s.text.compare(s.text.size() - len, len, stop, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
    safe = s.text.size() - hold;
  }
  const bool cut = stop_at != std::string::npos;
  size_t start = s.sent;
  bool any = false;
  while (!s.held.empty()) {
    Pending& p = s.held.front();
    const size_t end = p.text_end;
    if (cut ? start >= safe : end > safe) break;
    const size_t text_end = std::min(end, safe);
    p.token.text = s.text.substr(start, text_end - start);
    s.ready.push_back(std::move(p.token));
    s.held.pop_front();
    ++s.sent_tokens;
    s.sent = text_end;
    start = end;
    any = true;
  }
  if (cut) {
    // Nothing after the stop string: not its text, nor the tokens that carry it, nor a stop
    // token after them.
    s.held.clear();
    s.stop_token.reset();
    s.sent = safe;
    if (s.finish == FinishReason::kNone) stopped_.push_back(index);
    s.finish = FinishReason::kStop;
  }
  if (cut || at_end) {
    if (at_end && !cut && s.sent < s.text.size()) {
      s.trailing_text = s.text.substr(s.sent);  // the flushed end of a sent token
      s.sent = s.text.size();
    }
    s.finish_ready = true;
    any = true;
  }
  if (any) MarkReady(s);
}

void GenerateOutput::MarkReady(Sample& s) {
  if (s.ready_order == 0) s.ready_order = ++ready_counter_;
}

bool GenerateOutput::Next(SampleOutput* out) {
  Sample* best = nullptr;
  for (Sample& s : samples_) {
    if (s.ready_order == 0) continue;
    if (best == nullptr || s.ready_order < best->ready_order) best = &s;
  }
  if (best == nullptr) return false;
  out->sample_index = static_cast<uint32_t>(best - samples_.data());
  out->tokens = std::move(best->ready);
  best->ready.clear();
  out->finish_reason = FinishReason::kNone;
  out->trailing_text.clear();
  out->stop_token.reset();
  if (best->finish_ready && !best->finish_taken) {
    out->finish_reason = best->finish;
    out->trailing_text = std::move(best->trailing_text);
    out->stop_token = std::move(best->stop_token);
    best->finish_taken = true;
  }
  best->ready_order = 0;
  return true;
}

std::vector<uint32_t> GenerateOutput::StoppedSamples() { return std::exchange(stopped_, {}); }

bool GenerateOutput::done() const {
  if (!done_event_) return false;
  for (const Sample& s : samples_) {
    if (s.ready_order != 0) return false;
  }
  return true;
}

Usage GenerateOutput::usage() const {
  Usage u = usage_;
  bool any_stop_string = false;
  uint64_t sent = 0;
  for (const Sample& s : samples_) {
    sent += s.sent_tokens;
    if (s.finish == FinishReason::kStop && !stops_.empty()) any_stop_string = true;
  }
  if (any_stop_string) u.completion_tokens = static_cast<uint32_t>(sent);
  return u;
}

}  // namespace prefixd
