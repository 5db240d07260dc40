#include "server/generate_reactor.h"

#include <utility>

#include "base/check.h"
#include "server/grpc_status.h"
#include "server/inference_service.h"

namespace prefixd {
namespace {

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

GenerateReactor* GenerateReactor::Start(InferenceService* service,
                                        grpc::CallbackServerContext* context,
                                        const v1::GenerateRequest* request) {
  service->GenerateStarted();
  auto* reactor = new GenerateReactor(service, request);
  reactor->Begin(context);
  return reactor;
}

GenerateReactor::GenerateReactor(InferenceService* service, const v1::GenerateRequest* request)
    : service_(service), request_(request), link_(std::make_shared<Link>()) {
  absl::MutexLock l(&link_->mu);
  link_->reactor = this;
}

void GenerateReactor::FinishCall(const grpc::Status& status) {
  service_->path().FinishGenerate(static_cast<absl::StatusCode>(status.error_code()));
  Finish(status);  // `this` may be deleted from here on
}

void GenerateReactor::Begin(grpc::CallbackServerContext* context) {
  deadline_ = context->deadline();
  GenerateCall call = ToGenerateCall(*request_);
  call.authorization = AuthorizationOf(*context);
  absl::StatusOr<StartedGenerate> started = service_->path().StartGenerate(call);
  if (!started.ok()) {
    {
      absl::MutexLock l(&mu_);
      finished_ = true;
    }
    // Counted by the request path already: this call never started.
    Finish(ToGrpcStatus(started.status()));
    return;
  }
  request_id_ = started->request_id;
  top_logprobs_ = started->top_logprobs;
  {
    absl::MutexLock l(&mu_);
    decoders_.resize(started->num_samples);
  }
  stream_ = std::move(started->stream);
  std::weak_ptr<Link> weak = link_;
  stream_->SetNotify([weak] {
    std::shared_ptr<Link> link = weak.lock();
    if (!link) return;
    absl::MutexLock l(&link->mu);
    if (link->reactor != nullptr) link->reactor->Pump();
  });
  Pump();
}

bool GenerateReactor::BuildMessageLocked() {
  if (pending_.empty()) return false;
  msg_.Clear();
  msg_.set_request_id(request_id_);
  const RequestEvent& first = pending_.front();
  if (first.kind == RequestEvent::Kind::kDone) {
    done_ = true;
    done_status_ = first.status;
    const Usage u = first.usage;
    pending_.pop_front();
    if (!done_status_.ok()) return false;
    v1::Usage* usage = msg_.mutable_usage();
    usage->set_prompt_tokens(u.prompt_tokens);
    usage->set_cached_prompt_tokens(u.cached_prompt_tokens);
    usage->set_completion_tokens(u.completion_tokens);
    return true;
  }
  // Everything pending for this sample, up to and including its end.
  const uint32_t sample = first.sample_index;
  PREFIXD_CHECK(sample < decoders_.size());
  msg_.set_sample_index(sample);
  Utf8StreamDecoder& decoder = decoders_[sample];
  const Tokenizer& tok = service_->path().tokenizer();
  std::string text;
  std::deque<RequestEvent> rest;
  bool sample_ended = false;
  while (!pending_.empty()) {
    RequestEvent e = std::move(pending_.front());
    pending_.pop_front();
    if (sample_ended || e.kind == RequestEvent::Kind::kDone || e.sample_index != sample) {
      rest.push_back(std::move(e));
      continue;
    }
    if (e.kind == RequestEvent::Kind::kToken) {
      msg_.add_token_ids(e.token.token_id);
      msg_.add_logprobs(e.token.logprob);
      text += decoder.Push(tok.TokenBytes(e.token.token_id));
      if (top_logprobs_ > 0) {
        v1::TopLogprobs* top = msg_.add_top_logprobs();
        for (const TokenLogprob& t : e.top) {
          top->add_token_ids(t.token_id);
          top->add_logprobs(t.logprob);
        }
      }
    } else {  // kSampleFinished
      text += decoder.Flush();
      msg_.set_finish_reason(ToProto(e.finish_reason));
      sample_ended = true;
    }
  }
  pending_ = std::move(rest);
  msg_.set_text(std::move(text));
  // The stream's last message carries usage: fold a successful kDone into it when nothing
  // else is left to send.
  if (pending_.size() == 1 && pending_.front().kind == RequestEvent::Kind::kDone &&
      pending_.front().status.ok()) {
    const Usage u = pending_.front().usage;
    done_ = true;
    done_status_ = absl::OkStatus();
    pending_.pop_front();
    v1::Usage* usage = msg_.mutable_usage();
    usage->set_prompt_tokens(u.prompt_tokens);
    usage->set_cached_prompt_tokens(u.cached_prompt_tokens);
    usage->set_completion_tokens(u.completion_tokens);
  }
  return true;
}

void GenerateReactor::Pump() {
  enum class Action { kWrite, kFinish } action;
  grpc::Status finish_status;
  {
    absl::MutexLock l(&mu_);
    if (finished_ || write_in_flight_) return;
    if (!done_) {
      std::vector<RequestEvent> events;
      stream_->Poll(&events);
      for (RequestEvent& e : events) pending_.push_back(std::move(e));
    }
    if (cancelled_) {
      finished_ = true;
      action = Action::kFinish;
      // gRPC does not say why a call was cancelled. The client's own timer usually fires
      // first, and its cancel arrives before this side's deadline by about the time the
      // request took to get here (this side counts the timeout from arrival), hence the
      // margin; a client that cancels itself that close to its deadline is counted as a
      // deadline too.
      finish_status = std::chrono::system_clock::now() + std::chrono::milliseconds(250) >= deadline_
                          ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                         "the call's deadline passed")
                          : grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
    } else if (BuildMessageLocked()) {
      write_in_flight_ = true;
      action = Action::kWrite;
    } else if (done_) {
      finished_ = true;
      action = Action::kFinish;
      finish_status = ToGrpcStatus(done_status_);
    } else {
      return;
    }
  }
  // msg_ is not touched again until OnWriteDone, so StartWrite may read it unlocked.
  if (action == Action::kWrite) {
    StartWrite(&msg_);
  } else {
    FinishCall(finish_status);
  }
}

void GenerateReactor::OnWriteDone(bool ok) {
  {
    absl::MutexLock l(&mu_);
    write_in_flight_ = false;
    if (!ok) cancelled_ = true;
  }
  if (!ok) stream_->Cancel();
  Pump();
}

void GenerateReactor::OnCancel() {
  {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
  }
  if (stream_ != nullptr) stream_->Cancel();
  Pump();
}

void GenerateReactor::OnDone() {
  {
    absl::MutexLock l(&link_->mu);
    link_->reactor = nullptr;
  }
  if (stream_ != nullptr) stream_->Cancel();  // idempotent; a no-op after kDone
  InferenceService* service = service_;
  delete this;
  service->GenerateDone();
}

}  // namespace prefixd
