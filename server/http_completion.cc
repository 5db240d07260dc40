#include "server/http_completion.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/request_stream.h"

namespace prefixd {

HttpReply ErrorReply(const absl::Status& status) {
  return HttpReply{HttpStatusFor(status.code()), ErrorJson(status)};
}

HttpCompletion::HttpCompletion(RequestPath& path, CompletionRequest request)
    : path_(path), request_(std::move(request)) {}

HttpCompletion::~HttpCompletion() { Abandon(); }

absl::StatusOr<std::unique_ptr<HttpCompletion>> HttpCompletion::Start(
    RequestPath& path, CompletionRequest request, const std::optional<std::string>& authorization) {
  std::unique_ptr<HttpCompletion> c(new HttpCompletion(path, std::move(request)));
  c->header_.created = absl::ToUnixSeconds(absl::Now());
  // The name the client asked for: the base's, or its adapter's.
  c->header_.model = c->request_.prompts.empty() || c->request_.prompts[0].adapter.empty()
                         ? path.model().name
                         : c->request_.prompts[0].adapter;
  if (!c->request_.prompts.empty())
    c->header_.prompt_cache_key = c->request_.prompts[0].prompt_cache_key;
  std::vector<GenerateCall>& prompts = c->request_.prompts;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateCall& call = prompts[i];
    call.authorization = authorization;
    absl::StatusOr<StartedGenerate> started = path.StartGenerate(call);
    if (!started.ok()) {
      // All or nothing: the prompts already queued go back. Each prompt counts once, with
      // the code the client is answered (StartGenerate counted this one): those queued were
      // refused with it, not cancelled (Abandon would count them so), and those after it
      // were never tried.
      const absl::StatusCode code = started.status().code();
      for (Generation& g : c->gens_) {
        g.started.stream->Cancel();
        path.FinishGenerate(Api::kHttp, g.started.adapter_label, code);
        g.counted = true;
      }
      for (size_t j = i + 1; j < prompts.size(); ++j) {
        path.FinishGenerate(Api::kHttp, path.AdapterLabel(prompts[j].adapter), code);
      }
      return ToOpenAiError(started.status());
    }
    Generation& g = c->gens_.emplace_back();
    g.output.emplace(path.tokenizer(), started->num_samples, started->stop);
    c->samples_ = started->num_samples;
    g.started = *std::move(started);
  }
  c->header_.id = absl::StrCat("cmpl-", c->gens_.front().started.request_id);
  c->choices_.resize(c->gens_.size() * c->samples_);
  for (size_t i = 0; i < c->choices_.size(); ++i) {
    c->choices_[i].index = static_cast<uint32_t>(i);
    if (c->request_.logprobs.has_value()) c->choices_[i].logprobs.emplace();
  }
  return c;
}

void HttpCompletion::SetNotify(const std::function<void()>& notify) {
  for (Generation& g : gens_) g.started.stream->SetNotify(notify);
}

void HttpCompletion::Poll() {
  if (finished_) return;
  for (Generation& g : gens_) {
    if (g.output->done()) continue;
    std::vector<RequestEvent> events;
    if (g.started.stream->Poll(&events)) g.output->Add(std::move(events));
    for (uint32_t sample : g.output->StoppedSamples()) g.started.stream->StopSample(sample);
  }
}

bool HttpCompletion::CountFinished(std::string* error_events) {
  bool all = true;
  for (Generation& g : gens_) {
    if (!g.output->done()) {
      all = false;
      continue;
    }
    if (g.counted) continue;
    g.counted = true;
    path_.FinishGenerate(Api::kHttp, g.started.adapter_label, g.output->status().code());
    if (!g.output->status().ok()) {
      if (first_error_.ok()) first_error_ = g.output->status();
      if (error_events != nullptr) {
        absl::StrAppend(error_events, "data: ", ErrorJson(g.output->status()), "\n\n");
      }
    }
  }
  return all;
}

Usage HttpCompletion::TotalUsage() const {
  Usage total;
  for (const Generation& g : gens_) {
    const Usage u = g.output->usage();
    total.prompt_tokens += u.prompt_tokens;
    total.cached_prompt_tokens += u.cached_prompt_tokens;
    total.cached_disk_tokens += u.cached_disk_tokens;
    total.cached_remote_tokens += u.cached_remote_tokens;
    total.cached_retained_tokens += u.cached_retained_tokens;
    total.completion_tokens += u.completion_tokens;
  }
  return total;
}

std::optional<HttpReply> HttpCompletion::TakeWhole() {
  if (finished_) return std::nullopt;
  for (size_t gi = 0; gi < gens_.size(); ++gi) {
    std::vector<PromptToken> prompt;
    if (gens_[gi].output->TakePrompt(&prompt)) {
      for (uint32_t s = 0; s < samples_; ++s) {
        AppendPromptToChoice(path_.tokenizer(), prompt, &choices_[gi * samples_ + s]);
      }
    }
    SampleOutput out;
    while (gens_[gi].output->Next(&out)) {
      AppendToChoice(path_.tokenizer(), out, &choices_[gi * samples_ + out.sample_index]);
    }
  }
  if (!CountFinished(nullptr)) return std::nullopt;
  finished_ = true;
  if (!first_error_.ok()) return ErrorReply(first_error_);
  return HttpReply{200, CompletionJson(header_, choices_, TotalUsage())};
}

std::string HttpCompletion::TakeStreamBytes(bool* last) {
  *last = false;
  std::string data;
  if (finished_) return data;
  for (size_t gi = 0; gi < gens_.size(); ++gi) {
    std::vector<PromptToken> prompt;
    if (gens_[gi].output->TakePrompt(&prompt)) {
      // The prompt opens each choice's stream, in one chunk per choice.
      for (uint32_t s = 0; s < samples_; ++s) {
        Choice& sent = choices_[gi * samples_ + s];
        Choice delta;
        delta.index = sent.index;
        if (request_.logprobs.has_value()) delta.logprobs.emplace();
        AppendPromptToChoice(path_.tokenizer(), prompt, &delta);
        sent.text += delta.text;
        data.append(CompletionChunk(header_, delta));
      }
    }
    SampleOutput out;
    while (gens_[gi].output->Next(&out)) {
      Choice& sent = choices_[gi * samples_ + out.sample_index];
      Choice delta;
      delta.index = sent.index;
      if (request_.logprobs.has_value()) delta.logprobs.emplace();
      AppendToChoice(path_.tokenizer(), out, &delta);
      if (delta.logprobs.has_value()) {
        for (uint32_t& offset : delta.logprobs->text_offset) offset += sent.text.size();
      }
      sent.text += delta.text;
      data.append(CompletionChunk(header_, delta));
    }
  }
  if (CountFinished(&data)) {
    if (request_.include_usage) data.append(UsageChunk(header_, TotalUsage()));
    data.append(kDoneEvent);
    finished_ = true;
    *last = true;
  }
  return data;
}

void HttpCompletion::Abandon() {
  for (Generation& g : gens_) {
    if (g.counted) continue;
    g.counted = true;
    g.started.stream->Cancel();
    path_.FinishGenerate(Api::kHttp, g.started.adapter_label, absl::StatusCode::kCancelled);
  }
  finished_ = true;
}

}  // namespace prefixd
